/**
 * The `--l2-secret-file` rule and the MAC key (issue 24 item 14): what a
 * secret file must be (regular, mode 0600/0400, 32 bytes or more without
 * surrounding whitespace, at most 4096 bytes), each refusal naming the flag,
 * the path and what is expected; one secret gives one key wherever it is read.
 */
import { assert, describe, it } from "@effect/vitest"
import { execFileSync } from "node:child_process"
import { chmodSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect } from "effect"
import { type L2MacKey, L2SecretInvalid, macOf, readL2Secret } from "../../../../src/services/server/l2/L2Mac.ts"

const SECRET = "3f1e0a9c7b2d4e6f8091a2b3c4d5e6f70123456789abcdef0fedcba987654321"

/** A temporary folder, removed with the scope. */
const tempDir = Effect.acquireRelease(
  Effect.sync(() => mkdtempSync(join(tmpdir(), "mpcache-l2-secret-"))),
  (dir) => Effect.sync(() => rmSync(dir, { recursive: true, force: true }))
)

/** Writes `contents` to `dir/name` with `mode`; returns the path. */
const secretFile = (dir: string, name: string, contents: string | Uint8Array, mode = 0o600) => {
  const path = join(dir, name)
  writeFileSync(path, contents)
  chmodSync(path, mode)
  return path
}

/** The reason readL2Secret gives for `path` (the test fails when it accepts it). */
const refusal = (path: string) =>
  Effect.gen(function*() {
    const e = yield* Effect.flip(readL2Secret(path))
    assert.instanceOf(e, L2SecretInvalid)
    assert.strictEqual(e.path, path)
    assert.strictEqual(e.message, `--l2-secret-file ${path}: ${e.reason}`)
    return e.reason
  })

const macUnder = (key: L2MacKey) => macOf(key, "mpc:v1:k", Buffer.alloc(32), Buffer.from("payload")).toString("hex")

describe("--l2-secret-file", () => {
  it.effect("the same secret, written with and without a trailing newline or through a symlink, gives the same key; another secret another key", () =>
    Effect.gen(function*() {
      const dir = yield* tempDir
      const a = yield* readL2Secret(secretFile(dir, "a", `${SECRET}\n`))
      const b = yield* readL2Secret(secretFile(dir, "b", `  ${SECRET}\r\n\n`, 0o400))
      symlinkSync(join(dir, "a"), join(dir, "link"))
      const c = yield* readL2Secret(join(dir, "link"))
      const other = yield* readL2Secret(secretFile(dir, "other", `${SECRET.slice(0, -1)}0\n`))
      assert.strictEqual(macUnder(a), macUnder(b))
      assert.strictEqual(macUnder(a), macUnder(c))
      assert.notStrictEqual(macUnder(a), macUnder(other))
      // 32 bytes, the least accepted, and binary bytes as they are.
      yield* readL2Secret(secretFile(dir, "min", "x".repeat(32)))
      yield* readL2Secret(secretFile(dir, "raw", Uint8Array.from({ length: 32 }, (_, i) => 128 + i)))
      // The key never prints.
      assert.strictEqual(JSON.stringify(a), "{\"key\":{}}")
    }).pipe(Effect.scoped))

  it.effect("a short secret is refused, saying how long it must be and how to make one", () =>
    Effect.gen(function*() {
      const dir = yield* tempDir
      assert.strictEqual(
        yield* refusal(secretFile(dir, "short", `  ${"x".repeat(31)}  \n`)),
        "the secret must be at least 32 bytes without surrounding whitespace (got 31); e.g. openssl rand -hex 32 > FILE"
      )
      assert.strictEqual(
        yield* refusal(secretFile(dir, "empty", "\n")),
        "the secret must be at least 32 bytes without surrounding whitespace (got 0); e.g. openssl rand -hex 32 > FILE"
      )
    }).pipe(Effect.scoped))

  it.effect("a file that group or others may read or write is refused, naming its mode", () =>
    Effect.gen(function*() {
      const dir = yield* tempDir
      for (const mode of [0o640, 0o604, 0o620, 0o602, 0o644, 0o666]) {
        assert.strictEqual(
          yield* refusal(secretFile(dir, `m${mode.toString(8)}`, SECRET, mode)),
          `group or others may read or write it (mode 0${mode.toString(8)}); the secret must be readable by the server's user only: chmod 600 it`
        )
      }
    }).pipe(Effect.scoped))

  it.effect("a missing file, a folder, a FIFO (without blocking) and an oversized file are refused", () =>
    Effect.gen(function*() {
      const dir = yield* tempDir
      assert.match(yield* refusal(join(dir, "absent")), /^cannot read: ENOENT: no such file or directory, open '.+absent'$/)
      assert.strictEqual(yield* refusal(dir), "must be a regular file holding the secret")
      const fifo = join(dir, "fifo")
      execFileSync("mkfifo", ["-m", "600", fifo])
      assert.strictEqual(yield* refusal(fifo), "must be a regular file holding the secret")
      assert.strictEqual(yield* refusal(secretFile(dir, "big", "x".repeat(4097))), "holds 4097 bytes; a secret file holds at most 4096")
      yield* readL2Secret(secretFile(dir, "max", "x".repeat(4096)))
    }).pipe(Effect.scoped))
})
