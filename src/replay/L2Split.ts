/**
 * The L2 side of a replay's figures (issue 15 §7–8): how many of the chunks a
 * server's LOOKUPs reported came from L2, read from its `/metrics`, and the
 * L2 url as it may be printed.
 */
import { promSum } from "./Stats.ts"

/**
 * The counter of chunks a server's LOOKUPs found in L2 past their L1 prefix
 * (and reported as part of the prefix): the L2 counterpart of
 * `mpcache_lookup_hit_chunks_total`.
 */
export const L2_LOOKUP_HIT_CHUNKS = "mpcache_l2_hits_total"

/**
 * The sum of every sample of `L2_LOOKUP_HIT_CHUNKS` in Prometheus text (any labels), or undefined
 * when the server exports none (a server without an L2 tier).
 */
export const l2HitChunks = (metrics: string): number | undefined => promSum(metrics, L2_LOOKUP_HIT_CHUNKS)

/** `url` without the password of its user info (`redis://u:secret@h:1` → `redis://u:***@h:1`); other urls unchanged. */
export const redactUrl = (url: string): string => url.replace(/^([a-z+]+:\/\/[^:@/]*):[^@/]*@/, "$1:***@")
