/**
 * The authorized-keys file parser (issue 14 item 1; docs/security.md): the
 * grants of well-formed files (comments, blank lines, tenants, admin,
 * salt groups), and for every malformed line an error naming the file, the
 * line number and what was expected.
 */
import { mkdtempSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { type AuthorizedKeys, AuthorizedKeysInvalid, parseAuthorizedKeys, readAuthorizedKeys } from "../../../src/services/auth/AuthorizedKeys.ts"

const K1 = "[Ze6$c>Dg>80W0=V1dGpUMybTsXjz@*uYswejVl]"
const K2 = "@!{r#6UjH)3<Bf6Ko-zb}N0lo:(rEV}2*[Eue!ZB"
const K3 = "mfS+m5pK.[WBt^}h%GjX@jaA:*iAW=XuKs7&97m}"
const PATH = "/etc/mpcache/authorized_keys"
const EXPECTED = "(expected: <z85 public key> <tenant> [admin] [salt-group=NAME] [l1-share=WEIGHT])"

const parsed = (text: string): AuthorizedKeys => {
  const r = parseAuthorizedKeys(PATH, text)
  if (r instanceof AuthorizedKeysInvalid) return assert.fail(`unexpected error: ${r.message}`)
  return r
}

/** The error of `lines` (joined by newlines): its line and its message. */
const failure = (...lines: ReadonlyArray<string>) => {
  const r = parseAuthorizedKeys(PATH, lines.join("\n"))
  assert.instanceOf(r, AuthorizedKeysInvalid)
  const e = r as AuthorizedKeysInvalid
  return { line: e.line, message: e.message }
}

describe("authorized-keys file", () => {
  it("comments, blank lines and indentation are skipped; each key speaks for its tenant with its flags", () => {
    const r = parsed([
      "# mpcache clients",
      "",
      `  ${K1} teamA   `,
      "\t# another comment",
      `${K2}\tteamA`,
      `${K3} ops admin salt-group=shared`,
      ""
    ].join("\n"))
    assert.deepStrictEqual([...r.keys.entries()], [
      [K1, { tenant: "teamA", admin: false, saltGroup: "teamA" }],
      [K2, { tenant: "teamA", admin: false, saltGroup: "teamA" }],
      [K3, { tenant: "ops", admin: true, saltGroup: "shared" }]
    ])
    assert.strictEqual(r.path, PATH)
  })

  it("CRLF line ends are read as line ends; an empty file lists no key", () => {
    assert.deepStrictEqual([...parsed(`${K1} a\r\n${K2} b admin\r\n`).keys.values()].map((g) => [g.tenant, g.admin]), [["a", false], ["b", true]])
    assert.strictEqual(parsed("").keys.size, 0)
    assert.strictEqual(parsed("# nobody yet\n\n").keys.size, 0)
  })

  it("two tenants naming one salt group share it; flags may come in any order", () => {
    const r = parsed(`${K1} a salt-group=g admin\n${K2} b salt-group=g`)
    assert.deepStrictEqual(r.keys.get(K1), { tenant: "a", admin: true, saltGroup: "g" })
    assert.deepStrictEqual(r.keys.get(K2), { tenant: "b", admin: false, saltGroup: "g" })
  })

  it("l1-share=W is a tenant's weight in L1: a positive number, the same on every line of the tenant; absent, the server's default", () => {
    const r = parsed(`${K1} a l1-share=3\n${K2} a l1-share=3\n${K3} b l1-share=0.5 salt-group=g`)
    assert.deepStrictEqual([...r.keys.values()], [
      { tenant: "a", admin: false, saltGroup: "a", l1Share: 3 },
      { tenant: "a", admin: false, saltGroup: "a", l1Share: 3 },
      { tenant: "b", admin: false, saltGroup: "g", l1Share: 0.5 }
    ])
    for (const bad of ["0", "-1", "", "x", "Infinity", "1000001"]) {
      assert.deepStrictEqual(failure(`${K1} a l1-share=${bad}`), {
        line: 1,
        message: `${PATH}:1: l1-share "${bad}" must be a number above 0 and at most 1000000 (a weight: shares are relative)`
      })
    }
    assert.deepStrictEqual(failure(`${K1} a l1-share=2`, `${K2} a`).message, `${PATH}:2: tenant "a" has other flags on line 1; every key of a tenant carries the same flags`)
  })

  it("a key that is not 40 characters of Z85 names the line and the expected shape", () => {
    assert.deepStrictEqual(failure("# c", `${K1.slice(0, 39)} a`), {
      line: 2,
      message: `${PATH}:2: "${K1.slice(0, 39)}" is not a 40-character Z85 public key ${EXPECTED}`
    })
    const withSpace = `${K1.slice(0, 39)}"`
    assert.deepStrictEqual(failure(`${withSpace} a`), {
      line: 1,
      message: `${PATH}:1: "${withSpace}" is not a 40-character Z85 public key ${EXPECTED}`
    })
  })

  it("a key without a tenant names the line and what must follow", () => {
    assert.deepStrictEqual(failure(`${K1} a`, "", K2), {
      line: 3,
      message: `${PATH}:3: a key needs a tenant name after it ${EXPECTED}`
    })
  })

  it("a tenant or salt group outside the name syntax names the line and the syntax", () => {
    assert.deepStrictEqual(failure(`${K1} -team`), {
      line: 1,
      message: `${PATH}:1: tenant "-team" must be 1-64 of A-Z a-z 0-9 _ . - starting with a letter or digit`
    })
    assert.deepStrictEqual(failure(`${K1} ${"t".repeat(65)}`).line, 1)
    assert.deepStrictEqual(failure(`${K1} a`, `${K2} b salt-group=`), {
      line: 2,
      message: `${PATH}:2: salt group "" must be 1-64 of A-Z a-z 0-9 _ . - starting with a letter or digit`
    })
    assert.deepStrictEqual(failure(`${K1} a salt-group=x/y`).message, `${PATH}:1: salt group "x/y" must be 1-64 of A-Z a-z 0-9 _ . - starting with a letter or digit`)
  })

  it("an unknown flag names the line and the flags there are", () => {
    assert.deepStrictEqual(failure(`${K1} a Admin`), { line: 1, message: `${PATH}:1: unknown flag "Admin" (flags: admin, salt-group=NAME, l1-share=WEIGHT)` })
    assert.deepStrictEqual(failure(`${K1} a salt_group=g`).message, `${PATH}:1: unknown flag "salt_group=g" (flags: admin, salt-group=NAME, l1-share=WEIGHT)`)
  })

  it("a key listed twice names both lines, even under the same tenant", () => {
    assert.deepStrictEqual(failure(`${K1} a`, `${K2} b`, `${K1} a`), {
      line: 3,
      message: `${PATH}:3: this key is listed twice (first on line 1; a key speaks for one tenant)`
    })
    assert.strictEqual(failure(`${K1} a`, `${K1} b`).line, 2)
  })

  it("keys of one tenant with different flags name the line and the tenant's first line", () => {
    assert.deepStrictEqual(failure(`${K1} a admin`, "# x", `${K2} a`), {
      line: 3,
      message: `${PATH}:3: tenant "a" has other flags on line 1; every key of a tenant carries the same flags`
    })
    assert.strictEqual(failure(`${K1} a salt-group=g`, `${K2} a salt-group=h`).line, 2)
  })

  it("reading: a missing file fails naming it (line 0, no line number); a file on disk parses as its text", () => {
    const dir = mkdtempSync(join(tmpdir(), "mpcache-ak-"))
    const missing = readAuthorizedKeys(join(dir, "none"))
    assert.instanceOf(missing, AuthorizedKeysInvalid)
    assert.strictEqual((missing as AuthorizedKeysInvalid).line, 0)
    assert.match((missing as AuthorizedKeysInvalid).message, new RegExp(`^${join(dir, "none")}: cannot read: ENOENT`))
    const file = join(dir, "authorized_keys")
    writeFileSync(file, `${K1} a\n`)
    const r = readAuthorizedKeys(file)
    assert.notInstanceOf(r, AuthorizedKeysInvalid)
    assert.deepStrictEqual([...(r as AuthorizedKeys).keys.keys()], [K1])
  })
})
