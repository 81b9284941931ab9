/**
 * The HTTP frontend behind `--http-token-file` (issue 14 item 2), with a real
 * `mpcache serve` process and real HTTP requests: 401 without the header or
 * with a wrong token, 200 with the right one, on every route; `mpcache
 * status --http-token-file` reads through it.
 */
import { mkdtempSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { runCli } from "../support/Cli.ts"
import { curveFixture } from "../support/CurveMode.ts"
import { ipcEndpoint, startServer, startWorker, statusOf } from "../support/LiveFleet.ts"

const TOKEN = "e2e-token-abcdefghijklmnop"

const get = (url: string, authorization?: string) =>
  Effect.promise(async () => {
    const r = await fetch(url, authorization === undefined ? {} : { headers: { authorization } })
    return { status: r.status, wwwAuthenticate: r.headers.get("www-authenticate"), body: await r.text() }
  })

describe("HTTP bearer token (real server)", () => {
  it.live("without the header or with a wrong token: 401 naming the scheme; with the token: 200", () =>
    Effect.scoped(Effect.gen(function*() {
      const dir = mkdtempSync(join(tmpdir(), "mpcache-token-"))
      const tokenFile = join(dir, "token")
      // With the newline an editor adds: the server trims it.
      writeFileSync(tokenFile, `${TOKEN}\n`, { mode: 0o600 })
      const { httpPort } = yield* startServer(ipcEndpoint(), ["--http-token-file", tokenFile], 45_000)
      const base = `http://127.0.0.1:${httpPort}`
      const refused = { status: 401, wwwAuthenticate: "Bearer", body: "unauthorized: this frontend needs Authorization: Bearer <token>" }
      for (const path of ["/api/status", "/metrics", "/"]) {
        assert.deepStrictEqual(yield* get(`${base}${path}`), refused, `${path} without a header`)
        assert.deepStrictEqual(yield* get(`${base}${path}`, `Bearer ${TOKEN.slice(0, -1)}x`), refused, `${path} with a wrong token`)
        assert.deepStrictEqual(yield* get(`${base}${path}`, TOKEN), refused, `${path} without the scheme`)
        assert.strictEqual((yield* get(`${base}${path}`, `Bearer ${TOKEN}`)).status, 200, `${path} with the token`)
      }
      const status = JSON.parse((yield* get(`${base}/api/status`, `Bearer ${TOKEN}`)).body) as { readonly instances: ReadonlyArray<unknown> }
      assert.deepStrictEqual(status.instances, [])

      // The operator's client: `mpcache status` sends the token from its own --http-token-file.
      const statusCli = (extra: ReadonlyArray<string>) => runCli(["status", "--http-port", String(httpPort), "--json", ...extra], 30_000)
      const withToken = yield* statusCli(["--http-token-file", tokenFile])
      assert.strictEqual(withToken.code, 0, withToken.stderr)
      assert.deepStrictEqual((JSON.parse(withToken.stdout) as { readonly instances: ReadonlyArray<unknown> }).instances, [])
      const url = `http://127.0.0.1:${httpPort}/api/status`
      const without = yield* statusCli([])
      assert.strictEqual(without.code, 1)
      assert.include(without.stderr, `status: GET ${url} answered 401: this frontend needs a bearer token: give --http-token-file`)
      const wrongFile = join(dir, "wrong")
      writeFileSync(wrongFile, "not-the-token-0123456789\n", { mode: 0o600 })
      const wrong = yield* statusCli(["--http-token-file", wrongFile])
      assert.strictEqual(wrong.code, 1)
      assert.include(wrong.stderr, `status: GET ${url} answered 401: the token in --http-token-file is not this frontend's`)
    })), 90_000)

  it.live("GET /api/l1/chunks (the KV index audit's truth, issue 28 item 6): L1's chunks; under tenancy only behind the token", () =>
    Effect.scoped(Effect.gen(function*() {
      // No tenancy: every peer is an admin already; the listing holds what L1 holds.
      const endpoint = ipcEndpoint()
      const plain = yield* startServer(endpoint, [], 45_000)
      yield* startWorker(endpoint, 500, 60_000)
      const base = `http://127.0.0.1:${plain.httpPort}/api/l1/chunks`
      const listing = JSON.parse((yield* get(`${base}?model=liveness-e2e`)).body) as { model: string; count: number; chunks: Array<{ hash: string; salt_groups: Array<string> }> }
      const held = (yield* statusOf(plain.httpPort)).kv_events.held_chunks
      assert.deepStrictEqual([listing.model, listing.count, listing.chunks.length], ["liveness-e2e", held, held])
      assert.isAbove(held, 0)
      for (const c of listing.chunks) assert.deepStrictEqual([/^[0-9a-f]{64}$/.test(c.hash), c.salt_groups], [true, [""]])
      assert.deepStrictEqual(JSON.parse((yield* get(`${base}?model=another`)).body), { model: "another", count: 0, chunks: [] })

      // With CURVE the listing names every tenant's chunks: refused without the operator's token, served with it.
      const fx = curveFixture(true)
      const curved = yield* startServer(ipcEndpoint(), fx.serverArgs, 45_000)
      assert.deepStrictEqual(yield* get(`http://127.0.0.1:${curved.httpPort}/api/l1/chunks?model=m`), {
        status: 403,
        wwwAuthenticate: null,
        body: "forbidden: the L1 listing names every tenant's chunks; with tenancy on (CURVE) it needs the operator's token (--http-token-file)"
      })
      const dir = mkdtempSync(join(tmpdir(), "mpcache-token-"))
      const tokenFile = join(dir, "token")
      writeFileSync(tokenFile, `${TOKEN}\n`, { mode: 0o600 })
      const guarded = yield* startServer(ipcEndpoint(), [...fx.serverArgs, "--http-token-file", tokenFile], 45_000)
      const url = `http://127.0.0.1:${guarded.httpPort}/api/l1/chunks?model=m`
      assert.strictEqual((yield* get(url)).status, 401)
      assert.deepStrictEqual(yield* get(url, `Bearer ${TOKEN}`), { status: 200, wwwAuthenticate: null, body: JSON.stringify({ model: "m", count: 0, chunks: [] }) })
    })), 90_000)
})
