/**
 * The status page's L2 block (issue 15 item 7) in a real browser (headless
 * Chromium, as test/e2e/statusPage.test.ts) against a real server with a
 * real redis-server: state and store line, then "not connected" once redis
 * is gone. Skipped, loudly, without Chromium or redis-server.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import type { Page } from "playwright-core"
import { browserIn, hasChromium, warnWithoutChromium } from "../support/Browser.ts"
import { ipcEndpoint, startServer } from "../support/LiveFleet.ts"
import { startRedis } from "../support/RedisFleet.ts"
import { redisSuite } from "../support/RedisSuite.ts"

warnWithoutChromium("l2StatusPage.test.ts")

interface DomElement {
  readonly textContent: string | null
  readonly className: string
}
/** `#l2-state`, its class and `#l2-detail` as rendered. */
const l2Block = (page: Page) =>
  Effect.promise(() =>
    page.evaluate(() => {
      const document = (globalThis as unknown as { readonly document: { getElementById(id: string): DomElement | null } }).document
      const state = document.getElementById("l2-state")
      return { state: state?.textContent ?? "", cls: state?.className ?? "", detail: document.getElementById("l2-detail")?.textContent ?? "" }
    })
  )

/** Polls the DOM every 50 ms until `holds`, at most `timeoutMs` (the page polls every second). */
const until = <A>(read: Effect.Effect<A>, holds: (a: A) => boolean, timeoutMs: number) =>
  Effect.gen(function*() {
    const end = Date.now() + timeoutMs
    let a = yield* read
    while (!holds(a) && Date.now() < end) {
      yield* Effect.sleep("50 millis")
      a = yield* read
    }
    return a
  })

redisSuite("status page with L2", () => {
  describe.skipIf(!hasChromium)("in Chromium", () => {
    it.live("shows the L2 state and store; a redis that goes away shows as not connected", () =>
      Effect.scoped(Effect.gen(function*() {
        const redis = yield* startRedis()
        const { httpPort } = yield* startServer(ipcEndpoint(), ["--l2-url", redis.url, "--no-l1-prefault", "--l1-size-gb", "0.0625"])
        const context = yield* browserIn()
        const page = yield* Effect.promise(() => context.newPage())
        yield* Effect.promise(() => page.goto(`http://127.0.0.1:${httpPort}/`))
        const up = yield* until(l2Block(page), (b) => b.state === "ok", 10_000)
        assert.deepStrictEqual(up, {
          state: "ok",
          cls: "",
          detail: `${redis.url}; 0 B in flight (0 writes); 0 written, 0 dropped, 0 hit chunks, 0 corrupt; not authenticated`
        })
        yield* redis.kill
        const gone = yield* until(l2Block(page), (b) => b.detail.includes("not connected"), 10_000)
        assert.strictEqual(gone.state, "ok")
        assert.match(gone.detail, new RegExp(`^${redis.url.replace(/\./g, "\\.")} \\(not connected\\); 0 B in flight \\(0 writes\\); .*; last error: .+$`))
      })), 60_000)
  })
})
