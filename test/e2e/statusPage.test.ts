/**
 * The status page at `GET /` (issue 17) in a real browser: headless
 * Chromium (Debian's `chromium`, driven by playwright-core) loads it from a
 * real server with two real workers; one worker is SIGKILLed and the
 * rendered DOM shows it go `suspect`, then leave the instances and appear in
 * the reaps list. Screenshots stay under the test's temp folder
 * (`$TMPDIR/mpcache-status-page-*`; the path is printed).
 *
 * Where Chromium is missing the browser test is counted as skipped and the
 * suite says so loudly (`.ci/run` installs it). `MPCACHE_CHROMIUM` names
 * another binary.
 */
import { existsSync, mkdtempSync, readFileSync, statSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { chromium, type BrowserContext, type Page } from "playwright-core"
import { STATUS_PAGE_HTML } from "../../src/layers/StatusPage.ts"
import { eventually, getText, ipcEndpoint, startServer, startWorker, statusOf } from "../support/LiveFleet.ts"

const CHROMIUM = process.env["MPCACHE_CHROMIUM"] ?? "/usr/bin/chromium"
const hasChromium = existsSync(CHROMIUM)
const MISSING =
  `SKIPPED: no Chromium at ${CHROMIUM}; install it with \`apt-get update && apt-get install -y chromium\` (.ci/run does) or set MPCACHE_CHROMIUM`
if (!hasChromium) {
  // Straight to the process's stderr: the config silences console output of passing files.
  process.stderr.write(`\n*** statusPage.test.ts: the status page's browser test is ${MISSING} ***\n\n`)
  console.warn(`statusPage.test.ts: the browser test is ${MISSING}`)
}

/** A fresh headless Chromium profile under `dir`, closed with the scope. */
const browserIn = (dir: string) =>
  Effect.acquireRelease(
    Effect.promise(() =>
      chromium.launchPersistentContext(join(dir, "profile"), {
        executablePath: CHROMIUM,
        headless: true,
        args: [
          "--headless",
          "--no-sandbox",
          "--disable-gpu",
          "--disable-quic",
          "--no-first-run",
          "--disable-background-networking",
          "--disable-component-update",
          "--disable-sync"
        ],
        viewport: { width: 1280, height: 900 }
      })
    ),
    (context: BrowserContext) => Effect.promise(() => context.close())
  )

/** What the page shows: instance rows (id, state) and reap rows (id, reason, window cell). */
interface Rendered {
  readonly polls: number
  readonly instances: ReadonlyArray<{ readonly id: string; readonly state: string; readonly tenant: string }>
  readonly reaps: ReadonlyArray<{ readonly id: string; readonly reason: string; readonly window: string }>
  /** The server block's mapping limits line (issue 24 items 4 and 12). */
  readonly mapLimits: string
}
/** The little of the DOM the page is read through (the project compiles without lib "dom"). */
interface DomElement {
  readonly textContent: string | null
  getAttribute(name: string): string | null
  querySelector(selector: string): DomElement | null
}
interface DomDocument {
  readonly body: DomElement
  querySelectorAll(selector: string): Iterable<DomElement>
}
const rendered = (page: Page): Effect.Effect<Rendered> =>
  Effect.promise(() =>
    page.evaluate(() => {
      // Runs in the page.
      const document = (globalThis as unknown as { readonly document: DomDocument }).document
      const text = (el: DomElement, sel: string) => el.querySelector(sel)?.textContent ?? ""
      return {
        polls: Number(document.body.getAttribute("data-polls")),
        instances: [...document.querySelectorAll("#instances tbody tr[data-instance-id]")].map((tr) => ({
          id: tr.getAttribute("data-instance-id") ?? "",
          state: tr.querySelector("td.state")?.getAttribute("data-state") ?? "",
          tenant: text(tr, "td.tenant")
        })),
        reaps: [...document.querySelectorAll("#reaps tbody tr[data-instance-id]")].map((tr) => ({
          id: tr.getAttribute("data-instance-id") ?? "",
          reason: tr.getAttribute("data-reason") ?? "",
          window: text(tr, "td.window")
        })),
        mapLimits: text(document.body, "#server-map-limits")
      }
    })
  )

/** Polls the rendered DOM every 50 ms until `holds` (the page itself polls every second). */
const domEventually = (page: Page, holds: (r: Rendered) => boolean, timeoutMs: number) =>
  Effect.gen(function*() {
    const until = Date.now() + timeoutMs
    let r = yield* rendered(page)
    while (!holds(r) && Date.now() < until) {
      yield* Effect.sleep("50 millis")
      r = yield* rendered(page)
    }
    return r
  })

describe("status page", () => {
  it.live("GET / is one self-contained HTML page with a CSP that allows nothing external", () =>
    Effect.scoped(Effect.gen(function*() {
      const { httpPort } = yield* startServer(ipcEndpoint(), [])
      const res = yield* Effect.promise(() => fetch(`http://127.0.0.1:${httpPort}/`))
      assert.strictEqual(res.status, 200)
      assert.strictEqual(res.headers.get("content-type"), "text/html; charset=utf-8")
      assert.include(res.headers.get("content-security-policy") ?? "", "default-src 'none'")
      const body = yield* Effect.promise(() => res.text())
      assert.strictEqual(body, STATUS_PAGE_HTML)
      // No external resource of any kind: no URL with a scheme or protocol-relative reference in the page.
      assert.notMatch(body, /(src|href)\s*=|url\(|@import|https?:\/\/|\/\/[a-z0-9.-]+\.[a-z]{2,}/i)
      assert.include(body, `fetch("/api/status"`)
      // The document the page reads carries the reaps ring (empty) and the lookup totals.
      const doc = yield* statusOf(httpPort)
      assert.deepStrictEqual(doc.recent_reaps, [])
      assert.deepStrictEqual(
        [doc.lookup.lookups, doc.lookup.looked_up_chunks, doc.lookup.hit_chunks],
        [0, 0, 0]
      )
      assert.include(yield* getText(`http://127.0.0.1:${httpPort}/api/healthcheck`), "healthy")
    })), 60_000)

  it.live.skipIf(!hasChromium)(
    "in Chromium: two workers active; one SIGKILLed goes suspect, then leaves the instances and appears in the reaps (disconnect, 2 s)" +
      (hasChromium ? "" : ` — ${MISSING}`),
    () =>
      Effect.scoped(Effect.gen(function*() {
        const dir = mkdtempSync(join(tmpdir(), "mpcache-status-page-"))
        const endpoint = ipcEndpoint()
        const { httpPort } = yield* startServer(endpoint, ["--worker-disconnect-grace-seconds", "2"])
        const a = yield* startWorker(endpoint, 500, 60_000)
        const b = yield* startWorker(endpoint, 500, 60_000)
        const origin = `http://127.0.0.1:${httpPort}`

        const context = yield* browserIn(dir)
        const page = yield* Effect.promise(() => context.newPage())
        const requested: Array<string> = []
        page.on("request", (r) => void requested.push(r.url()))
        const errors: Array<string> = []
        page.on("pageerror", (e) => void errors.push(e.message))
        yield* Effect.promise(() => page.goto(`${origin}/`, { waitUntil: "load" }))

        const both = yield* domEventually(
          page,
          (r) => r.instances.length === 2 && r.instances.every((i) => i.state === "active"),
          15_000
        )
        assert.deepStrictEqual(
          [...both.instances].sort((x, y) => x.id.localeCompare(y.id)),
          [a.instanceId, b.instanceId].sort().map((id) => ({ id, state: "active", tenant: "—" }))
        )
        assert.deepStrictEqual(both.reaps, [])
        // Readiness as /readyz says it: every check passing.
        assert.deepStrictEqual(
          yield* Effect.promise(() => page.$eval("#server-readiness", (e) => [e.getAttribute("data-status"), e.textContent])),
          ["ready", "ready (mq_bound, l1_pool, reaper, fd_socket, l2)"]
        )
        // No tenancy here (CURVE off): L1 is one LRU, and the page hides its per-tenant table.
        assert.deepStrictEqual(
          yield* Effect.promise(() => page.$eval("#l1-tenants", (e) => [e.hasAttribute("hidden"), e.querySelectorAll("tbody tr").length])),
          [true, 0]
        )
        yield* Effect.promise(() => page.screenshot({ path: join(dir, "1-two-active.png"), fullPage: true }))

        a.worker.child.kill("SIGKILL")
        const suspect = yield* domEventually(
          page,
          (r) => r.instances.some((i) => i.id === a.instanceId && i.state === "suspect"),
          10_000
        )
        assert.deepStrictEqual(
          [...suspect.instances].sort((x, y) => x.id.localeCompare(y.id)),
          [
            { id: a.instanceId, state: "suspect", tenant: "—" },
            { id: b.instanceId, state: "active", tenant: "—" }
          ].sort((x, y) => x.id.localeCompare(y.id))
        )
        yield* Effect.promise(() => page.screenshot({ path: join(dir, "2-suspect.png"), fullPage: true }))

        const reaped = yield* domEventually(
          page,
          (r) => r.instances.every((i) => i.id !== a.instanceId) && r.reaps.length > 0,
          10_000
        )
        assert.deepStrictEqual(reaped.instances, [{ id: b.instanceId, state: "active", tenant: "—" }])
        assert.deepStrictEqual(reaped.reaps, [{ id: a.instanceId, reason: "disconnect", window: "2" }])
        // The survivor's two segments against the bounds derived from the kernel's cap.
        const cap = Number(readFileSync("/proc/sys/vm/max_map_count", "utf8"))
        assert.match(
          reaped.mapLimits,
          new RegExp(`^2 / ${Math.floor(cap / 2)} mappings · ≤ 1024 segments per REGISTER · host \\S+ \\S+ / \\S+ \\S+ · process maps \\d+ of ${cap} \\(vm\\.max_map_count\\) · refused 0$`)
        )
        const shot = join(dir, "3-reaped.png")
        yield* Effect.promise(() => page.screenshot({ path: shot, fullPage: true }))
        assert.isAbove(statSync(shot).size, 1000)
        console.log(`status page screenshots: ${dir}`)

        // It updated itself: one navigation, many polls; every request went to the server itself.
        const navigations = yield* Effect.promise(() => page.evaluate(() =>
          (globalThis as unknown as { readonly performance: { getEntriesByType(t: string): ArrayLike<unknown> } }).performance
            .getEntriesByType("navigation").length
        ))
        assert.strictEqual(navigations, 1)
        assert.isAtLeast(reaped.polls, 3)
        assert.deepStrictEqual(requested.filter((u) => !u.startsWith(`${origin}/`)), [])
        assert.deepStrictEqual(errors, [])

        // The server's own record agrees with what the page showed.
        const doc = yield* eventually(statusOf(httpPort), (d) => d.recent_reaps.length === 1, 2_000)
        assert.deepStrictEqual(
          doc.recent_reaps.map((r) => [r.instance_id, r.reason, r.window_seconds, r.module]),
          [[a.instanceId, "disconnect", 2, "lmcache_driven_transfer"]]
        )
        assert.isAtLeast(doc.recent_reaps[0]!.silent_seconds, 2)
      })),
    90_000
  )
})
