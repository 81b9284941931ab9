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
import { mkdtempSync, readFileSync, statSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import type { Page } from "playwright-core"
import * as zmq from "zeromq"
import { STATUS_PAGE_HTML } from "../../src/layers/StatusPage.ts"
import { browserIn, hasChromium, NO_CHROMIUM, screenshotDir, warnWithoutChromium } from "../support/Browser.ts"
import { eventually, getText, ipcEndpoint, startServer, startWorker, statusOf } from "../support/LiveFleet.ts"

warnWithoutChromium("statusPage.test.ts")

/** What the page shows: instance rows (id, state) and reap rows (id, reason, window cell). */
interface Rendered {
  readonly polls: number
  readonly instances: ReadonlyArray<{ readonly id: string; readonly state: string; readonly tenant: string }>
  /** Each instance's mapped-bytes cell: its text and `data-bytes`. */
  readonly mapped: ReadonlyArray<{ readonly id: string; readonly text: string; readonly bytes: string }>
  readonly reaps: ReadonlyArray<{ readonly id: string; readonly reason: string; readonly window: string; readonly time: string }>
  /** `#poll-status`, and every `.time-zone` label. */
  readonly pollStatus: string
  readonly zones: ReadonlyArray<string>
  /** The page's whole text (to find any time written in another format). */
  readonly text: string
  /** The server block's mapping limits line (issue 24 items 4 and 12). */
  readonly mapLimits: string
  /** The KV events panel (issue 28 item 7): state, log, recorded, publisher. */
  readonly kvEvents: ReadonlyArray<string>
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
        mapped: [...document.querySelectorAll("#instances tbody tr[data-instance-id]")].map((tr) => ({
          id: tr.getAttribute("data-instance-id") ?? "",
          text: text(tr, "td.mapped"),
          bytes: tr.querySelector("td.mapped")?.getAttribute("data-bytes") ?? ""
        })),
        reaps: [...document.querySelectorAll("#reaps tbody tr[data-instance-id]")].map((tr) => ({
          id: tr.getAttribute("data-instance-id") ?? "",
          reason: tr.getAttribute("data-reason") ?? "",
          window: text(tr, "td.window"),
          time: text(tr, "td.time")
        })),
        pollStatus: text(document.body, "#poll-status"),
        zones: [...document.querySelectorAll(".time-zone")].map((e) => e.textContent ?? ""),
        text: document.body.textContent ?? "",
        mapLimits: text(document.body, "#server-map-limits"),
        kvEvents: ["state", "log", "records", "publisher"].map((k) => text(document.body, `#kv-events-${k}`))
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
      (hasChromium ? "" : ` — ${NO_CHROMIUM}`),
    () =>
      Effect.scoped(Effect.gen(function*() {
        const dir = screenshotDir("status-page")
        const endpoint = ipcEndpoint()
        const pub = `ipc://${join(mkdtempSync(join(tmpdir(), "mpcache-page-pub-")), "pub")}`
        const { httpPort } = yield* startServer(endpoint, ["--worker-disconnect-grace-seconds", "2", "--kv-events-endpoint", pub])
        const sub = yield* Effect.acquireRelease(Effect.sync(() => new zmq.Subscriber({ linger: 0 })), (s) => Effect.sync(() => s.close()))
        sub.connect(pub)
        sub.subscribe()
        const a = yield* startWorker(endpoint, 500, 60_000)
        const b = yield* startWorker(endpoint, 500, 60_000)
        const origin = `http://127.0.0.1:${httpPort}`

        const context = yield* browserIn()
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
        // Each instance's row shows the worker memory the server maps for it, and the rows add up to the
        // server card's figure.
        const api = yield* statusOf(httpPort)
        const mappedOf = (id: string) => api.instances.find((i) => i.instance_id === id)!
        assert.deepStrictEqual(
          [...both.mapped].sort((x, y) => x.id.localeCompare(y.id)).map((m) => [m.id, m.bytes]),
          [a.instanceId, b.instanceId].sort().map((id) => [id, String(mappedOf(id).mapped_bytes)])
        )
        for (const m of both.mapped) {
          assert.isAbove(Number(m.bytes), 0)
          assert.match(m.text, new RegExp(`^\\d+(\\.\\d)? (B|KiB|MiB|GiB) in ${mappedOf(m.id).mappings} mapping\\(s\\)$`))
        }
        assert.strictEqual(api.instances.reduce((n, i) => n + (i.mapped_bytes ?? 0), 0), api.native.mapped_bytes)
        // Readiness as /readyz says it: every check passing.
        assert.deepStrictEqual(
          yield* Effect.promise(() => page.$eval("#server-readiness", (e) => [e.getAttribute("data-status"), e.textContent])),
          ["ready", "ready (mq_bound, l1_pool, reaper, fd_socket, l2)"]
        )
        // The KV events panel says what /api/status says: the workers' first STOREs in the log, one subscriber.
        const ev = (yield* eventually(statusOf(httpPort), (s) => s.kv_events.publisher?.subscribers === 1 && s.kv_events.records.stored > 0, 10_000)).kv_events
        const expected = [
          "on",
          `${ev.depth} / 32768 records · seq 1 … ${ev.newest_seq} · incarnation ${ev.incarnation}`,
          `${ev.depth} stored · 0 removed · 0 dropped · 0 lost answers · ${ev.held_chunks} chunks held`,
          `${pub} (topic "kv-events") · 1 subscriber(s) · ${ev.publisher?.batches_published} batches · no replay`
        ]
        assert.deepStrictEqual((yield* domEventually(page, (r) => r.kvEvents.join("\n") === expected.join("\n"), 10_000)).kvEvents, expected)
        // Nothing left L1 yet: every record kept is a `stored`, one per chunk held.
        assert.deepStrictEqual([ev.records, ev.held_chunks], [{ stored: ev.depth, removed: 0 }, ev.depth])
        assert.isAbove(ev.depth, 0)
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
        assert.deepStrictEqual(reaped.reaps.map(({ time: _, ...r }) => r), [{ id: a.instanceId, reason: "disconnect", window: "2" }])
        // One time format throughout: local date and time to the second, the zone named in the headers.
        const dateTime = /^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$/
        assert.match(reaped.reaps[0]!.time, dateTime)
        assert.match(reaped.pollStatus, /^updated \d{4}-\d\d-\d\d \d\d:\d\d:\d\d$/)
        assert.strictEqual(reaped.zones.length, 2)
        for (const z of reaped.zones) assert.match(z, /^local, UTC[+−]\d\d:\d\d$/)
        // Every clock time on the page follows its date (no "11:14:05 PM", no ISO "T…Z" beside it).
        const clocks = [...reaped.text.matchAll(/(\d{4}-\d\d-\d\d[ T])?\d{1,2}:\d\d:\d\d(\s?[AaPp]\.?[Mm]|Z|\.\d+)?/g)]
        assert.isAtLeast(clocks.length, 2)
        for (const c of clocks) assert.isTrue(c[1]?.endsWith(" ") === true && c[2] === undefined, `a time in another format: ${c[0]}`)
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
