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
