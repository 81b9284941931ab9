import { assert, describe, it } from "@effect/vitest"
import { ConversationRouter, conversationKey } from "../../src/replay/Routing.ts"

describe("ConversationRouter", () => {
  it("a conversation's turns rotate over the servers; each new conversation starts on the next server", () => {
    const router = new ConversationRouter(2)
    const trace = [[0, 1], [0, 1, 2], [0, 7], [0, 1, 2, 3], [0, 7, 8], [9, 12], [0, 7, 8, 10], [9, 12, 11]]
    assert.deepStrictEqual(trace.map((h) => router.route(h)), [0, 1, 1, 0, 0, 0, 1, 1])
  })

  it("with 3 servers, three turns of one conversation land on three different servers", () => {
    const router = new ConversationRouter(3)
    assert.deepStrictEqual([[4, 5], [4, 5, 6], [4, 5, 6, 7], [4, 5, 6, 7, 8]].map((h) => router.route(h)), [0, 1, 2, 0])
  })

  it("one server takes everything; the key is the first two blocks", () => {
    const router = new ConversationRouter(1)
    assert.deepStrictEqual([[1], [2, 3], [2, 3, 4]].map((h) => router.route(h)), [0, 0, 0])
    assert.strictEqual(conversationKey([0, 14, 15]), "0,14")
    assert.strictEqual(conversationKey([5]), "5")
    assert.throws(() => new ConversationRouter(0), /servers must be an integer of at least 1 \(got 0\)/)
  })
})
