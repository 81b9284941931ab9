/**
 * The admin listing of what L1 holds (issue 28 item 6; docs/kv-events.md "Index audit"): the chunks of a model
 * of which L1 holds at least one rank's committed object — exactly the set a router fed by the KV event stream
 * should hold for this server in `CPU`, so an audit can compare the two. Served at `GET /api/l1/chunks?model=M`
 * (src/layers/Http.ts).
 *
 * Threat: the listing names every tenant's chunk hashes, and a hash stands for a prompt prefix; a tenant that
 * reads it learns what others asked (DESIGN §8). So with tenancy on (CURVE) it answers only behind the operator's
 * bearer token (`--http-token-file`), and is refused (403) when there is none; without tenancy every peer is an
 * admin already (POLL_KV_EVENTS reads all salt groups) and the frontend's own rule applies (loopback, or the token).
 */
import { hashHex } from "../kv/TokenHasher.ts"
import type { L1Store } from "./L1Store.ts"

/** The listing's body: the model, its chunks sorted by hash (hex), each with its salt groups. */
export interface L1ChunkListing {
  readonly model: string
  readonly count: number
  readonly chunks: ReadonlyArray<{ readonly hash: string; readonly salt_groups: ReadonlyArray<string> }>
}

/** The chunks of `model` in `l1` (every model's when `model` is undefined, hashes then shared across models). */
export const listL1Chunks = (l1: L1Store["Service"], model: string | undefined): L1ChunkListing => {
  const groups = new Map<string, Set<string>>()
  l1.forEachCommitted((key, saltGroup) => {
    if (model !== undefined && key.modelName !== model) return
    const h = hashHex(key.hash)
    let g = groups.get(h)
    if (g === undefined) groups.set(h, g = new Set())
    g.add(saltGroup)
  })
  const chunks = [...groups.keys()].sort().map((hash) => ({ hash, salt_groups: [...groups.get(hash)!].sort() }))
  return { model: model ?? "*", count: chunks.length, chunks }
}

/** Why the listing is refused for a frontend of this configuration, or undefined when it may answer. */
export const listingRefusal = (tenancyOn: boolean, tokenFile: string | undefined): string | undefined =>
  tenancyOn && tokenFile === undefined
    ? "forbidden: the L1 listing names every tenant's chunks; with tenancy on (CURVE) it needs the operator's token (--http-token-file)"
    : undefined
