/**
 * The hit ratio a perfect LRU cache of a given capacity reaches on the same
 * requests (the replay summary's reference; method of the trace README, in
 * chunks): requests in trace order; a request's hits are the longest prefix
 * of its complete chunks already cached; then all its complete chunks are
 * inserted or touched in order, and the least recently used are evicted
 * beyond capacity. A chunk is identified by its 512-token block's hash id
 * and its index within the block (ids are prefix-chained).
 */
import { TRACE_BLOCK_TOKENS } from "./Trace.ts"

export interface LruResult {
  readonly lookedUpChunks: number
  readonly hitChunks: number
  /** hitChunks / lookedUpChunks (0 when nothing was looked up). */
  readonly hitRatio: number
}

/** Complete chunks of a request: keys `hashId:chunkInBlock`. */
export const chunkKeys = (hashIds: ReadonlyArray<number>, inputLength: number, chunkSizeTokens: number): Array<string> => {
  const n = Math.floor(inputLength / chunkSizeTokens)
  const perBlock = TRACE_BLOCK_TOKENS / chunkSizeTokens
  const out = new Array<string>(n)
  for (let c = 0; c < n; c++) {
    const pos = c * chunkSizeTokens
    out[c] = `${hashIds[Math.floor(pos / TRACE_BLOCK_TOKENS)]}:${Number.isInteger(perBlock) ? c % perBlock : pos % TRACE_BLOCK_TOKENS}`
  }
  return out
}

/** Simulates an LRU of `capacityChunks` over `requests`. */
export const perfectLru = (
  requests: ReadonlyArray<{ readonly hashIds: ReadonlyArray<number>; readonly inputLength: number }>,
  chunkSizeTokens: number,
  capacityChunks: number
): LruResult => {
  const steps = perfectLruCumulative(requests, chunkSizeTokens, capacityChunks)
  const [lookedUp, hits] = steps[steps.length - 1] ?? [0, 0]
  return { lookedUpChunks: lookedUp, hitChunks: hits, hitRatio: lookedUp === 0 ? 0 : hits / lookedUp }
}

/**
 * The same simulation, step by step: element i is the cumulative
 * `[lookedUpChunks, hitChunks]` after request i (the replay report's
 * perfect-LRU line, issue 17).
 */
export const perfectLruCumulative = (
  requests: ReadonlyArray<{ readonly hashIds: ReadonlyArray<number>; readonly inputLength: number }>,
  chunkSizeTokens: number,
  capacityChunks: number
): Array<readonly [number, number]> => {
  const cache = new Map<string, true>()
  const out: Array<readonly [number, number]> = []
  let lookedUp = 0
  let hits = 0
  for (const r of requests) {
    const keys = chunkKeys(r.hashIds, r.inputLength, chunkSizeTokens)
    lookedUp += keys.length
    let h = 0
    while (h < keys.length && cache.has(keys[h]!)) h++
    hits += h
    for (const k of keys) {
      cache.delete(k)
      cache.set(k, true)
    }
    while (cache.size > capacityChunks) cache.delete(cache.keys().next().value!)
    out.push([lookedUp, hits])
  }
  return out
}
