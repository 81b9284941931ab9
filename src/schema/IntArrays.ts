/**
 * Wire arrays of integers checked in one pass: the token ids and block ids
 * every STORE, RETRIEVE and LOOKUP carries (DESIGN §3.2). `token_ids` is
 * the whole prefix, so a long prompt sends tens of thousands per request;
 * `Schema.Array(TokenId)` decodes each element through the parser's checks
 * (about 0.1 µs and several allocations per token, a fifth of what a STORE
 * allocated: issue 16), where one loop does the same checks at once.
 *
 * They accept exactly what `Schema.Array(TokenId)` and `Schema.Array(Uint)`
 * accept (src/schema/Integer.ts), fail with the same messages at the same
 * paths (`… at ["token_ids"][7]`), and derive the same arbitraries (their
 * codec is the element-wise schema, which the tests' round trips use).
 */
import { Effect, Schema, SchemaIssue, SchemaTransformation } from "effect"
import { MAX_TOKEN_ID, MINUS_ZERO_MESSAGE, TokenId, Uint } from "./Integer.ts"
import { MAX_BLOCK_IDS, MAX_TOKEN_IDS } from "./Limits.ts"

const MAX_SAFE_BIG = BigInt(Number.MAX_SAFE_INTEGER)

/** The message for element `v` (undefined: valid), as Schema's checks word it. */
type ElementCheck = (v: unknown) => string | undefined

const tokenIdProblem: ElementCheck = (v) =>
  typeof v !== "number"
    ? "Expected number"
    : !Number.isSafeInteger(v)
    ? "Expected an integer"
    : v < 0 || v > MAX_TOKEN_ID
    ? `Expected a value between 0 and ${MAX_TOKEN_ID}`
    : Object.is(v, -0)
    ? MINUS_ZERO_MESSAGE
    : undefined

const uintProblem: ElementCheck = (v) =>
  typeof v === "bigint"
    ? v < 0n || v > MAX_SAFE_BIG ? `Expected a value between 0n and ${MAX_SAFE_BIG}n` : undefined
    : typeof v !== "number"
    ? "Expected number | bigint"
    : !Number.isSafeInteger(v)
    ? "Expected an integer"
    : v < 0
    ? "Expected a value greater than or equal to 0"
    : Object.is(v, -0)
    ? MINUS_ZERO_MESSAGE
    : undefined

/** At most `max` elements, named `unit` in the failure (issue 24 item 5: src/schema/Limits.ts). */
interface LengthBound {
  readonly max: number
  readonly unit: string
}

/**
 * An array schema whose elements `problem` checks in one loop; `element` is
 * the element-wise equivalent that arbitraries derive from (the declaration's
 * codec). Bigints (msgpackr's uint64) become numbers, as `Uint` decodes them;
 * the input array is copied only then. With `bound`, a longer array fails
 * before any element is looked at.
 */
const intArray = (
  problem: ElementCheck,
  element: Schema.Codec<number, number | bigint> | Schema.Codec<number, number>,
  bound?: LengthBound
) =>
  Schema.declareConstructor<ReadonlyArray<number>, ReadonlyArray<number | bigint>>()(
    [],
    () => (u, ast, options) => {
      if (!Array.isArray(u)) return Effect.fail(new SchemaIssue.InvalidType(ast, u, options))
      if (bound !== undefined && u.length > bound.max) {
        return Effect.fail(
          new SchemaIssue.InvalidValue({ message: `must have at most ${bound.max} ${bound.unit}, got ${u.length}` }, undefined, options)
        )
      }
      let out: Array<unknown> = u
      for (let i = 0; i < u.length; i++) {
        const v: unknown = u[i]
        const message = problem(v)
        if (message !== undefined) return Effect.fail(new SchemaIssue.Pointer([i], new SchemaIssue.InvalidValue({ message }, v, options)))
        if (typeof v === "bigint") {
          if (out === u) out = u.slice()
          out[i] = Number(v)
        }
      }
      return Effect.succeed(out as ReadonlyArray<number>)
    },
    {
      expected: "array",
      toCodec: () => Schema.link<ReadonlyArray<number>>()(Schema.Array(element), SchemaTransformation.passthrough())
    }
  )

/**
 * `token_ids`: uint32s (DESIGN §3.2 hashes them as big-endian uint32), as `Schema.Array(TokenId)`, at most
 * `MAX_TOKEN_IDS` of them.
 */
export const TokenIds = intArray(tokenIdProblem, TokenId, { max: MAX_TOKEN_IDS, unit: "token ids (MAX_TOKEN_IDS)" })

/** Non-negative safe integers, uint64 bigints made numbers, as `Schema.Array(Uint)`. */
export const UintArray = intArray(uintProblem, Uint)

/** One KV group's block ids (`block_ids[g]`): a `UintArray` of at most `MAX_BLOCK_IDS`. */
export const BlockIdList = intArray(uintProblem, Uint, { max: MAX_BLOCK_IDS, unit: "block ids in one KV group (MAX_BLOCK_IDS)" })
