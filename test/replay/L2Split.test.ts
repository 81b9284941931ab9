import { assert, describe, it } from "@effect/vitest"
import { l2HitChunks, redactUrl } from "../../src/replay/L2Split.ts"

describe("L2Split", () => {
  it("sums every sample of mpcache_l2_hits_total; undefined when the server exports none", () => {
    const text = [
      "# TYPE mpcache_l2_hits_total counter",
      "mpcache_l2_hits_total{model=\"a\"} 12",
      "mpcache_l2_hits_total{model=\"b\"} 30",
      "mpcache_lookup_hit_chunks_total 99",
      "mpcache_l2_hits_total_extra 5"
    ].join("\n")
    assert.strictEqual(l2HitChunks(text), 42)
    assert.strictEqual(l2HitChunks("mpcache_l2_hits_total 7\n"), 7)
    assert.strictEqual(l2HitChunks("mpcache_lookup_hit_chunks_total 99\n"), undefined)
  })

  it("a url's password is hidden, its user and host kept", () => {
    assert.strictEqual(redactUrl("redis://mpc:s3cret@127.0.0.1:6379"), "redis://mpc:***@127.0.0.1:6379")
    assert.strictEqual(redactUrl("rediss://:pw@h:1"), "rediss://:***@h:1")
    assert.strictEqual(redactUrl("redis+cluster://127.0.0.1:1,127.0.0.1:2"), "redis+cluster://127.0.0.1:1,127.0.0.1:2")
  })
})
