/**
 * HMAC-SHA256 off the JS thread (issue 24 item 14 follow-up, DESIGN §4 "copies never on the JS thread"): the
 * MAC of an authenticated L2 value hashes the whole 32 MiB object (~35 ms here), and on the server's main thread
 * that blocks every PING and every socket write behind it (issue 16's PING-under-transfers targets).
 * WebCrypto's `subtle.sign` does not help: measured, it blocks the loop as well.
 *
 * The native backend is the addon's `hmacSha256` (src/native/addon/hmac.h): OpenSSL's own HMAC, taken from the
 * Node binary at run time (dlsym, never linked: EVP_MAC_* of OpenSSL 3, else HMAC_*), run on the libuv pool
 * at the pool's lowered priority, reading the parts in place. Where the addon does not load or this Node does
 * not export those symbols, or `MPCACHE_NATIVE_HMAC=0` is set, the backend is node:crypto's `createHmac` on
 * the JS thread: the same bytes, the same tag, only where it runs differs.
 *
 * At most half the libuv pool (`UV_THREADPOOL_SIZE`, default 4: 2 jobs) hashes at once, so the pool always
 * has threads for the copies of STORE and RETRIEVE, which share it.
 */
import { createHmac, type KeyObject } from "node:crypto"
import { Effect, Semaphore } from "effect"
import { loadNativeAddon, type NativeAddon } from "./Native.ts"

/** Where the MAC is computed: the addon's OpenSSL API on the libuv pool, or node:crypto on the JS thread. */
export type HmacBackend = "evp_mac" | "hmac" | "node:crypto"

/** HMAC-SHA256 as the L2 tier uses it. */
export interface HmacSha256 {
  readonly backend: HmacBackend
  /** Why the backend is node:crypto ("" when it is native). */
  readonly fallbackReason: string
  /** One sentence for the start log: where MACs run and, for node:crypto, why. */
  readonly description: string
  /**
   * The 32-byte HMAC-SHA256 under `key` of the concatenation of `parts` (no part is copied). Native: the
   * parts are read on the libuv pool while it runs, so the caller must keep their bytes unchanged and
   * mapped until the effect ends; once the job is queued the effect is uninterruptible (an interrupt
   * waits for the job), so a finalizer that releases the bytes runs after it. Waiting for a pool share
   * is interruptible. Never fails: a native failure (ECRYPTO) is answered by createHmac of the same
   * parts, with a WARNING.
   */
  readonly digest: (key: KeyObject, parts: ReadonlyArray<Uint8Array>) => Effect.Effect<Buffer>
}

/** How to choose the backend. */
export interface HmacOptions {
  /** false: node:crypto on the JS thread. Default: native when available, unless `MPCACHE_NATIVE_HMAC=0`. */
  readonly native?: boolean
  /** Which OpenSSL API the native backend uses (tests); default the first the addon's probe accepts. */
  readonly api?: "evp_mac" | "hmac"
}

/** createHmac of `parts` on the JS thread. */
const onThisThread = (key: KeyObject, parts: ReadonlyArray<Uint8Array>): Buffer => {
  const h = createHmac("sha256", key)
  for (const part of parts) h.update(part)
  return h.digest()
}

const nodeCrypto = (fallbackReason: string): HmacSha256 => ({
  backend: "node:crypto",
  fallbackReason,
  description: `computed on the JS thread with node:crypto (the native HMAC is not used: ${fallbackReason})`,
  digest: (key, parts) => Effect.sync(() => onThisThread(key, parts))
})

/** Jobs hashing at once: half the libuv pool, at least one. */
const poolShare = (): number => {
  const size = Number(process.env["UV_THREADPOOL_SIZE"] ?? "4")
  return Math.max(1, Math.floor((Number.isInteger(size) && size > 0 ? size : 4) / 2))
}

/** The backend `options` ask for, or node:crypto and why not. */
const chooseNative = (options: HmacOptions): { addon: NativeAddon; api: "evp_mac" | "hmac" } | string => {
  if (options.native === false) return "turned off by the caller"
  if (options.native === undefined && process.env["MPCACHE_NATIVE_HMAC"] === "0") return "turned off by MPCACHE_NATIVE_HMAC=0"
  let addon: NativeAddon
  try {
    addon = loadNativeAddon()
  } catch (e) {
    return e instanceof Error ? e.message : String(e)
  }
  const probe = addon.hmacProbe()
  const api = options.api ?? probe.apis[0]
  if (api === undefined) return `this Node exports no usable OpenSSL HMAC (${probe.reason})`
  if (!probe.apis.includes(api)) return `OpenSSL's ${api} API is not usable here (${probe.reason})`
  return { addon, api }
}

/**
 * The HMAC-SHA256 backend for `options` (see {@link HmacOptions}); probes the addon once (its probe is
 * cached per process). Synchronous, with the addon load as its side effect.
 *
 * @category constructors
 */
export const makeHmacSha256Unsafe = (options: HmacOptions = {}): HmacSha256 => {
  const chosen = chooseNative(options)
  if (typeof chosen === "string") return nodeCrypto(chosen)
  const { addon, api } = chosen
  const share = Semaphore.makeUnsafe(poolShare())
  // The raw bytes of each key, exported once (a KeyObject hands them out only through export()).
  const rawKeys = new WeakMap<KeyObject, Buffer>()
  const rawOf = (key: KeyObject) => {
    let raw = rawKeys.get(key)
    if (raw === undefined) {
      raw = key.export()
      rawKeys.set(key, raw)
    }
    return raw
  }
  const onPool = (key: KeyObject, parts: ReadonlyArray<Uint8Array>): Effect.Effect<Buffer> =>
    Effect.uninterruptible(Effect.tryPromise(() => addon.hmacSha256(rawOf(key), parts, api))).pipe(
      Effect.catch((e) =>
        Effect.logWarning(`native HMAC-SHA256 failed (${e.cause instanceof Error ? e.cause.message : String(e.cause)}); computed with node:crypto instead`)
          .pipe(Effect.as(onThisThread(key, parts)))
      )
    )
  return {
    backend: api,
    fallbackReason: "",
    description: `computed on the libuv pool with this Node's OpenSSL (${api === "evp_mac" ? "EVP_MAC" : "HMAC_*"})`,
    digest: (key, parts) => share.withPermits(1)(onPool(key, parts))
  }
}

let shared: HmacSha256 | undefined

/** One default backend per process ({@link makeHmacSha256Unsafe} with no options), made on first use. */
export const defaultHmacSha256 = (): HmacSha256 => (shared ??= makeHmacSha256Unsafe())
