/**
 * The HTTP bearer-token check (issue 14 item 2; docs/security.md): only
 * `Bearer <token>` exactly passes, and every header is compared as a
 * 32-byte digest, so the compare's work does not depend on the header's
 * length or on how much of the token it matches.
 */
import { assert, describe, it } from "@effect/vitest"
import { bearerCheck, headerDigest } from "../../../src/services/auth/BearerToken.ts"

const TOKEN = "s3cret-token-0123456789"

describe("bearer token", () => {
  it("passes `Bearer <token>` and nothing else", () => {
    const check = bearerCheck(TOKEN)
    assert.isTrue(check(`Bearer ${TOKEN}`))
    assert.isFalse(check(undefined), "no header")
    assert.isFalse(check(""), "empty header")
    assert.isFalse(check(TOKEN), "the token without the scheme")
    assert.isFalse(check(`Bearer ${TOKEN.slice(0, -1)}`), "a prefix of the token")
    assert.isFalse(check(`Bearer ${TOKEN}x`), "the token and more")
    assert.isFalse(check(`Bearer ${TOKEN.slice(0, -1)}8`), "the last character wrong")
    assert.isFalse(check(`Basic ${TOKEN}`), "another scheme")
    assert.isFalse(check(`Bearer  ${TOKEN}`), "two spaces")
    assert.isFalse(bearerCheck(`${TOKEN}x`)(`Bearer ${TOKEN}`), "another token")
  })

  it("compares fixed 32-byte digests, whatever the header's length (constant time: timingSafeEqual needs equal lengths)", () => {
    for (const header of ["", "B", `Bearer ${TOKEN}`, "x".repeat(100_000)]) assert.strictEqual(headerDigest(header).length, 32)
    // SHA-256 of "Bearer s3cret-token-0123456789", as `printf %s 'Bearer s3cret-token-0123456789' | sha256sum` gives it.
    assert.strictEqual(headerDigest(`Bearer ${TOKEN}`).toString("hex"), "5dab3abfdb92fe3a9be9fd2c2e6e944f26be69145b017e10b3f401f9ddb2c0f2")
  })
})
