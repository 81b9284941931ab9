/**
 * What the replay reads of its servers' counters, summed over them: reaps by
 * reason (`mpcache_reaps_total`) and, per server, L2 hit chunks; and whether
 * each server has the L2 the run was given.
 *
 * @internal
 */
import { Effect } from "effect"
import { l2HitChunks } from "../L2Split.ts"
import { ReplayError } from "../ReplayOptions.ts"
import { promCounters } from "../Stats.ts"
import type { Node } from "./Fleet.ts"
import { getJson, getText } from "./ServerHttp.ts"

const metricsOf = (node: Node) => getText(`${node.httpUrl}/metrics`, node.httpToken)

/** Reaps by reason now, summed over `nodes`. */
export const reapsNow = (nodes: ReadonlyArray<Node>) =>
  Effect.map(Effect.forEach(nodes, metricsOf), (texts) => {
    const out: Record<string, number> = {}
    for (const t of texts) for (const [k, v] of Object.entries(promCounters(t, "mpcache_reaps_total", "reason"))) out[k] = (out[k] ?? 0) + v
    return out
  })

/** Per server, the L2 hit counter now (absent until the first L2 hit, and on a server without L2: 0). */
export const l2HitsNow = (nodes: ReadonlyArray<Node>) =>
  Effect.forEach(nodes, (node) => Effect.map(metricsOf(node), (text) => l2HitChunks(text) ?? 0))

/** With --l2-url every server must say it has an L2 (`l2` in /api/status), or the split would be made up. */
export const checkL2 = (nodes: ReadonlyArray<Node>) =>
  Effect.forEach(nodes, (node) =>
    Effect.flatMap(getJson(`${node.httpUrl}/api/status`, node.httpToken), (doc) =>
      typeof doc["l2"] === "object" && doc["l2"] !== null
        ? Effect.void
        : Effect.fail(new ReplayError({ message: `${node.httpUrl}/api/status has no l2: this server has no L2 tier, so its L2 hits cannot be told apart` }))), { discard: true })
