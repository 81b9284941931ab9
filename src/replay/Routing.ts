/**
 * Which of the replay's N servers takes each request (issue 15 §8: "routes
 * each conversation's requests to servers round-robin so that cross-server
 * reuse is real"). A conversation is the requests sharing their first two
 * 512-token blocks (Mooncake ids are prefix-chained: a later turn repeats
 * its conversation's blocks, and block 0 alone is often a prompt shared by
 * everyone); a one-block request is its own block's conversation. The first
 * turn of the k-th conversation seen goes to server k mod N, and each later
 * turn to the server after its previous one, so consecutive turns of a
 * conversation never meet on the same server when N > 1: whatever they
 * reuse of each other comes through the shared L2, or not at all.
 */

/** The conversation a request belongs to: its first two block hash ids. */
export const conversationKey = (hashIds: ReadonlyArray<number>): string => hashIds.slice(0, 2).join(",")

/** Round-robin of conversations' turns over `servers` servers (0-based indexes). */
export class ConversationRouter {
  private readonly next = new Map<string, number>()
  private conversations = 0
  readonly servers: number

  constructor(servers: number) {
    this.servers = servers
    if (!Number.isInteger(servers) || servers < 1) throw new RangeError(`servers must be an integer of at least 1 (got ${servers})`)
  }

  /** The server of the next request with these block ids, in trace order. */
  route(hashIds: ReadonlyArray<number>): number {
    const key = conversationKey(hashIds)
    const server = this.next.get(key) ?? this.conversations++ % this.servers
    this.next.set(key, (server + 1) % this.servers)
    return server
  }
}
