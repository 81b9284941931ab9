/**
 * The `--l2-*` flags of `mpcache serve` (issue 15 item 1; rules and defaults
 * in src/services/server/l2/L2Config.ts). An invalid value exits 2 naming
 * the flag.
 */
import { Option } from "effect"
import { Flag } from "effect/cli"
import { type L2ConfigInput, l2Defaults, l2Rules } from "../../services/server/l2/L2Config.ts"
import { described } from "./flags.ts"

const checked = <A>(flag: Flag.Flag<A>, rule: (a: A) => string | undefined): Flag.Flag<A> =>
  flag.pipe(Flag.filter((a) => rule(a) === undefined, (a) => rule(a) ?? ""))

const int = (name: string, description: string, fallback: number, rule: (n: number) => string | undefined = l2Rules.positiveInt) =>
  checked(Flag.Int(name).pipe(Flag.withDescription(described(description, fallback)), Flag.withDefault(fallback)), rule)

export const l2Flags = {
  l2Url: checked(
    Flag.String("l2-url").pipe(
      Flag.withDescription(described("Turn the L2 tier on: redis://[user:pass@]host:port, rediss:// (TLS), or redis+cluster://host:port[,host:port…]", "none: L2 off"))
    ),
    l2Rules.url
  ).pipe(Flag.optional),
  l2KeyPrefix: checked(
    Flag.String("l2-key-prefix").pipe(Flag.withDescription(described("First part of every L2 key: 1 to 64 of A-Z a-z 0-9 _ . -", l2Defaults.keyPrefix)), Flag.withDefault(l2Defaults.keyPrefix)),
    l2Rules.keyPrefix
  ),
  l2TtlSeconds: int("l2-ttl-seconds", "Expiry of values written to L2, whole seconds; 0 = none", l2Defaults.ttlSeconds, l2Rules.ttlSeconds),
  l2MaxInflightBytes: int("l2-max-inflight-bytes", "Bytes of L2 writes in flight past which new writes are dropped; >= 1", l2Defaults.maxInflightBytes),
  l2LookupTimeoutMs: int("l2-lookup-timeout-ms", "Limit of a LOOKUP's L2 step (EXISTS), ms; >= 1", l2Defaults.lookupTimeoutMs),
  l2TransferTimeoutMs: int("l2-transfer-timeout-ms", "Limit of one L2 GET or SET, ms; >= 1", l2Defaults.transferTimeoutMs),
  l2BreakerFailures: int("l2-breaker-failures", "L2 failures or timeouts within the window that open the breaker; >= 1", l2Defaults.breakerFailures),
  l2BreakerWindowMs: int("l2-breaker-window-ms", "Window of the breaker's failure count, ms; >= 1", l2Defaults.breakerWindowMs),
  l2BreakerProbeMs: int("l2-breaker-probe-ms", "First PING probe delay of an open breaker (doubled per failed probe, jittered), ms; >= 1", l2Defaults.breakerProbeMs),
  l2BreakerProbeMaxMs: int("l2-breaker-probe-max-ms", "Cap of the breaker's probe delay, ms; >= --l2-breaker-probe-ms", l2Defaults.breakerProbeMaxMs),
  l2SecretFile: Flag.String("l2-secret-file").pipe(
    Flag.withDescription(described(
      "Authenticate every L2 value with HMAC-SHA256 under this fleet secret (same file on every server sharing the L2): a file of mode 0600/0400 holding at least 32 bytes, surrounding whitespace ignored (openssl rand -hex 32 > FILE); a value without a valid MAC is a miss, deleted and counted",
      "none: values carry a checksum only"
    )),
    Flag.optional
  )
}

type FlagValue<T> = T extends Flag.Flag<infer A> ? A : never

/** The parsed `--l2-*` flags as L2ConfigInput. */
export const l2InputOf = (f: { readonly [K in keyof typeof l2Flags]: FlagValue<(typeof l2Flags)[K]> }): L2ConfigInput => ({
  url: Option.getOrUndefined(f.l2Url),
  keyPrefix: f.l2KeyPrefix,
  ttlSeconds: f.l2TtlSeconds,
  maxInflightBytes: f.l2MaxInflightBytes,
  lookupTimeoutMs: f.l2LookupTimeoutMs,
  transferTimeoutMs: f.l2TransferTimeoutMs,
  breakerFailures: f.l2BreakerFailures,
  breakerWindowMs: f.l2BreakerWindowMs,
  breakerProbeMs: f.l2BreakerProbeMs,
  breakerProbeMaxMs: f.l2BreakerProbeMaxMs,
  secretFile: Option.getOrUndefined(f.l2SecretFile)
})
