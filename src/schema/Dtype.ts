/**
 * Element types of KV tensors (DESIGN §3.2 TensorDescriptor.dtype), named as
 * torch names them without the `torch.` prefix (upstream E4 wire form).
 */
import { Schema } from "effect"

/** Bytes per element of each supported dtype. */
export const DTYPE_BYTES = {
  float16: 2,
  bfloat16: 2,
  float32: 4,
  float64: 8,
  uint8: 1,
  int8: 1,
  int16: 2,
  int32: 4,
  int64: 8,
  float8_e4m3fn: 1,
  float8_e5m2: 1
} as const

export type Dtype = keyof typeof DTYPE_BYTES

/** The dtype literal; an unknown name is a `bad_request` naming the field. */
export const Dtype = Schema.Literals(Object.keys(DTYPE_BYTES) as ReadonlyArray<Dtype>)

/** Element size in bytes. */
export const dtypeBytes = (dtype: Dtype): number => DTYPE_BYTES[dtype]
