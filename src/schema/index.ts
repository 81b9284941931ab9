/**
 * `mpcache/schema`: the wire protocol v1 (DESIGN §3) as a library — the op
 * table, every payload and response Schema, the frame codec and the wire
 * errors, for programs that speak to an mpcache server in their own way.
 *
 * This entry lives inside `src/schema` because it depends on nothing else:
 * it is the room's public face, and re-exports every module of it so that
 * a program never imports a file path. Schemas and codecs only: importing
 * it starts nothing and loads no service, socket or native code.
 */
export * from "./CacheKey.ts"
export * from "./CbMatch.ts"
export * from "./Dtype.ts"
export * from "./EngineDriven.ts"
export * from "./Frame.ts"
export * from "./InstanceId.ts"
export * from "./Integer.ts"
export * from "./Limits.ts"
export * from "./Op.ts"
export * from "./OpMeta.ts"
export * from "./PlainMsgpack.ts"
export * from "./Registration.ts"
export * from "./TensorDescriptor.ts"
export * from "./Text.ts"
export * from "./ValueDescription.ts"
export * from "./WireError.ts"
