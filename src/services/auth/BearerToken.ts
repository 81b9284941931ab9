/**
 * The HTTP frontend's bearer token (`--http-token-file`, docs/security.md;
 * issue 14 item 2): the check of a request's `Authorization` header.
 *
 * Both sides are compared as SHA-256 digests with `timingSafeEqual`: two
 * 32-byte buffers whatever the header holds, so the time of a refusal says
 * nothing about the token's length or how long a prefix matched (the threat:
 * a client on the network guessing the token byte by byte from timings).
 */
import { createHash, timingSafeEqual } from "node:crypto"
import { readFileSync } from "node:fs"
import { Effect, Schema } from "effect"

/** The digest a header is compared as: SHA-256, 32 bytes for any input. */
export const headerDigest = (header: string): Buffer => createHash("sha256").update(header).digest()

/**
 * The check for `token`: true only for the header `Bearer <token>` exactly
 * (the scheme as RFC 6750 writes it, one space, the token); a missing
 * header is false.
 */
export const bearerCheck = (token: string): (authorization: string | undefined) => boolean => {
  const expected = headerDigest(`Bearer ${token}`)
  return (authorization) => timingSafeEqual(headerDigest(authorization ?? ""), expected)
}

/** The `--http-token-file` cannot be read or is empty. */
export class HttpTokenInvalid extends Schema.TaggedError<HttpTokenInvalid>()("HttpTokenInvalid", {
  path: Schema.String,
  reason: Schema.String
}) {
  override get message(): string {
    return `--http-token-file ${this.path}: ${this.reason}`
  }
}

/** Shortest token accepted: 16 characters (a guessable token is no lock). */
export const MIN_TOKEN_LENGTH = 16

/**
 * Reads a token file (one line; surrounding whitespace trimmed), the same
 * way for the server (`serve --http-token-file`) and its clients (`status
 * --http-token-file`). Fails with HttpTokenInvalid when it cannot be read or
 * holds fewer than MIN_TOKEN_LENGTH characters.
 */
export const readTokenFile = (path: string): Effect.Effect<string, HttpTokenInvalid> =>
  Effect.try({
    try: () => readFileSync(path, "utf8").trim(),
    catch: (e) => new HttpTokenInvalid({ path, reason: `cannot read: ${e instanceof Error ? e.message : String(e)}` })
  }).pipe(
    Effect.filterOrFail(
      (token) => token.length >= MIN_TOKEN_LENGTH,
      () => new HttpTokenInvalid({ path, reason: `the token must be at least ${MIN_TOKEN_LENGTH} characters` })
    )
  )
