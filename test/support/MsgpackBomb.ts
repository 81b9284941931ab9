/**
 * The frames of issue 24 item 3, built byte by byte as an attacker would
 * (no encoder): msgpackr's structured-clone extensions let a few hundred
 * bytes describe a value with 2^depth leaves.
 *
 *   level 0      = ext 0x69 (id 0) [1, 1]
 *   level k      = ext 0x69 (id k) [level k-1, ext 0x70 (pointer to id k-1)]
 *
 * Each ext is a `fixext 4` (0xd6, type, 4-byte id); msgpackr reads the value
 * after an id extension as its target, and a pointer returns the very object
 * built for that id, so level k holds level k-1 twice: 13 bytes per level,
 * 2^depth leaves (depth 26: 335 bytes with the trailing byte, 67,108,864 leaves). A trailing byte makes msgpackr's own "end of buffer not
 * reached" message JSON-stringify the whole value.
 */

const fixext4 = (type: number, id: number): Buffer => {
  const b = Buffer.alloc(6)
  b[0] = 0xd6
  b[1] = type
  b.writeUInt32BE(id, 2)
  return b
}

/** The reference bomb of `depth` levels (≥ 1); `trailingByte`: one nil after it, as in the issue. */
export const referenceBomb = (depth: number, trailingByte: boolean): Buffer => {
  let v = Buffer.concat([fixext4(0x69, 0), Buffer.from([0x92, 0x01, 0x01])])
  for (let k = 1; k < depth; k++) v = Buffer.concat([fixext4(0x69, k), Buffer.from([0x92]), v, fixext4(0x70, k - 1)])
  return trailingByte ? Buffer.concat([v, Buffer.from([0xc0])]) : v
}

/** `depth` nested one-element arrays around a 0 (plain MessagePack, no extension): `[[[…[0]…]]]`. */
export const nestedArrays = (depth: number): Buffer => Buffer.concat([Buffer.alloc(depth, 0x91), Buffer.from([0x00])])
