/**
 * The descriptor-cap flags of `mpcache serve` (issue 24 item 11; the budget and its defaults in
 * src/services/server/DescriptorBudget.ts). Each is optional: left out, the cap is a share of RLIMIT_NOFILE.
 */
import { Option } from "effect"
import { Flag } from "effect/cli"
import type { DescriptorBudgetInput } from "../../services/server/DescriptorBudget.ts"
import { rules } from "../../services/server/ServerConfig.ts"
import { described } from "./flags.ts"

const cap = (name: string, description: string, shown: string) =>
  Flag.Int(name).pipe(
    Flag.withDescription(described(`${description}; >= 1`, shown)),
    Flag.filter((n) => rules.positiveInt(n) === undefined, (n) => rules.positiveInt(n) ?? ""),
    Flag.optional
  )

export const descriptorFlags = {
  maxZmqConnections: cap("max-zmq-connections", "Concurrent ZeroMQ connections; past it new ones are closed at once", "1/2 of RLIMIT_NOFILE"),
  maxHttpConnections: cap("max-http-connections", "Concurrent HTTP connections", "1/32 of RLIMIT_NOFILE, at most 1024"),
  fdSocketMaxConnections: cap("fd-socket-max-connections", "Concurrent descriptor-socket connections", "1/64 of RLIMIT_NOFILE, at most 128"),
  fdSocketMaxConnectionsPerUid: cap(
    "fd-socket-max-connections-per-uid",
    "Concurrent descriptor-socket connections of one uid; at most --fd-socket-max-connections", "1/8 of --fd-socket-max-connections"
  ),
  maxPassedDescriptors: cap("max-passed-descriptors", "Passed descriptors held for tokens not yet registered", "1/8 of RLIMIT_NOFILE"),
  maxPassedDescriptorsPerPeer: cap(
    "max-passed-descriptors-per-peer",
    "Passed descriptors held for one ZeroMQ connection; at most --max-passed-descriptors", "1/8 of --max-passed-descriptors, at least 64"
  )
}

type FlagValue<T> = T extends Flag.Flag<infer A> ? A : never

/** The parsed descriptor-cap flags as DescriptorBudgetInput. */
export const descriptorCapsOf = (
  f: { readonly [K in keyof typeof descriptorFlags]: FlagValue<(typeof descriptorFlags)[K]> }
): DescriptorBudgetInput => ({
  maxZmqConnections: Option.getOrUndefined(f.maxZmqConnections),
  maxHttpConnections: Option.getOrUndefined(f.maxHttpConnections),
  fdSocketMaxConnections: Option.getOrUndefined(f.fdSocketMaxConnections),
  fdSocketMaxConnectionsPerUid: Option.getOrUndefined(f.fdSocketMaxConnectionsPerUid),
  maxPassedDescriptors: Option.getOrUndefined(f.maxPassedDescriptors),
  maxPassedDescriptorsPerPeer: Option.getOrUndefined(f.maxPassedDescriptorsPerPeer)
})
