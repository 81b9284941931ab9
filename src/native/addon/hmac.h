// HMAC-SHA256 on the libuv pool (issue 24 item 14 follow-up): the MAC of every authenticated L2 value
// (src/services/server/l2/L2Mac.ts) takes ~35 ms per 32 MiB, which on the JS thread blocks every PING and every
// socket write behind it. The hash is OpenSSL's, taken from the Node binary that loaded this addon: its
// EVP_MAC_* (OpenSSL 3) or HMAC_* (1.1 and 3) symbols are resolved at run time with dlsym(RTLD_DEFAULT, …),
// never linked, so the addon still loads under a Node that does not export them; then hmacProbe says why
// and the TypeScript side uses node:crypto instead (src/native/Hmac.ts). No SHA-256 of our own.
//   hmacProbe() -> { apis: ("evp_mac" | "hmac")[], reason }
//       the APIs that resolved and passed RFC 4231's test case 2, preferred first; `reason` says what
//       was missing or failed ("" when both work). Resolved once per process.
//   hmacSha256(key, parts, api?) -> Promise<Buffer>   (32 bytes; on the libuv pool)
//       HMAC-SHA256 under `key` (a Uint8Array) of the concatenation of `parts` (Uint8Arrays, read in
//       place: no copy). Each part is held by a reference until the promise settles; the caller must
//       keep its bytes unchanged and its memory mapped until then. `api` picks one of hmacProbe's
//       (tests); the default is the first. Throws EINVAL for bad arguments, ENOSYS when the API is not
//       available; rejects with ECRYPTO when OpenSSL fails.
//   hmacInFlight() -> number   jobs queued or running whose promise has not settled (process-wide; tests)
#pragma once

#include <napi.h>

namespace mpcache {

Napi::Value HmacProbe(const Napi::CallbackInfo& info);
Napi::Value HmacSha256(const Napi::CallbackInfo& info);
Napi::Value HmacInFlight(const Napi::CallbackInfo& info);

}  // namespace mpcache
