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
import { ipcEndpoint, startServer } from "../support/LiveFleet.ts"

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
})
