/**
 * Mooncake request traces (JSONL; `data/mooncake-traces/README.md`): one
 * request per line with `timestamp` (ms), `input_length`, `output_length`
 * (tokens) and `hash_ids` (one per 512-token block, prefix-chained).
 * Malformed lines are reported with their line number and skipped.
 */
import { readFileSync } from "node:fs"
import { Effect, Exit, Schema } from "effect"

/** Tokens per trace block. */
export const TRACE_BLOCK_TOKENS = 512

const NonNegInt = Schema.Int.check(Schema.isGreaterThanOrEqualTo(0))

const TraceLine = Schema.Struct({
  timestamp: Schema.Finite.check(Schema.isGreaterThanOrEqualTo(0)),
  input_length: NonNegInt.check(Schema.isGreaterThanOrEqualTo(1)),
  output_length: NonNegInt,
  hash_ids: Schema.Array(NonNegInt)
}).check(
  Schema.makeFilter((r) =>
    r.hash_ids.length === Math.ceil(r.input_length / TRACE_BLOCK_TOKENS)
      ? undefined
      : `hash_ids has ${r.hash_ids.length} ids; input_length ${r.input_length} needs ceil(${r.input_length} / 512) = ${Math.ceil(r.input_length / TRACE_BLOCK_TOKENS)}`
  )
)

/** One request of a trace. */
export interface TraceRequest {
  /** 0-based position among the usable requests. */
  readonly index: number
  /** 1-based line in the file. */
  readonly line: number
  readonly timestampMs: number
  readonly inputLength: number
  readonly outputLength: number
  readonly hashIds: ReadonlyArray<number>
}

/** A line that could not be used. */
export interface TraceIssue {
  readonly line: number
  readonly message: string
}

/** The trace could not be read, or held no usable request. */
export class TraceError extends Schema.TaggedError<TraceError>()("TraceError", { message: Schema.String }) {}

/**
 * Reads the first `limit` usable requests of `path` (all when undefined).
 * Blank lines are ignored; malformed ones are returned as issues. Fails with
 * TraceError when the file cannot be read or nothing in it is usable.
 */
export const readTrace = (
  path: string,
  limit: number | undefined
): Effect.Effect<{ readonly requests: ReadonlyArray<TraceRequest>; readonly issues: ReadonlyArray<TraceIssue> }, TraceError> =>
  Effect.gen(function*() {
    const text = yield* Effect.try({
      try: () => readFileSync(path, "utf8"),
      catch: (e) => new TraceError({ message: `cannot read trace ${path}: ${e instanceof Error ? e.message : String(e)}` })
    })
    const requests: Array<TraceRequest> = []
    const issues: Array<TraceIssue> = []
    const lines = text.split("\n")
    for (let i = 0; i < lines.length && (limit === undefined || requests.length < limit); i++) {
      const raw = lines[i]!.trim()
      if (raw.length === 0) continue
      let json: unknown
      try {
        json = JSON.parse(raw)
      } catch (e) {
        issues.push({ line: i + 1, message: `not JSON: ${e instanceof Error ? e.message : String(e)}` })
        continue
      }
      const decoded = Schema.decodeUnknownExit(TraceLine)(json)
      if (Exit.isFailure(decoded)) {
        const error = decoded.cause.reasons[0]
        issues.push({
          line: i + 1,
          message: (error?._tag === "Fail" ? (error.error as Schema.SchemaError).message : "does not decode").replace(/\s*\n\s*/g, " ")
        })
        continue
      }
      const r = decoded.value
      requests.push({
        index: requests.length,
        line: i + 1,
        timestampMs: r.timestamp,
        inputLength: r.input_length,
        outputLength: r.output_length,
        hashIds: r.hash_ids
      })
    }
    if (requests.length === 0) {
      return yield* new TraceError({
        message: `trace ${path} has no usable request (${issues.length} malformed line(s)${
          issues.length > 0 ? `; first at line ${issues[0]!.line}: ${issues[0]!.message}` : ""
        })`
      })
    }
    return { requests, issues }
  })
