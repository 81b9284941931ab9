/**
 * The KV event log's size (issue 28 item 1; docs/kv-events.md): how many
 * records a server keeps for routers to read (`--kv-event-log-size`,
 * default 32768; 0 turns events off).
 */
import { type ConfigIssue, issueCheck } from "./ConfigIssue.ts"

/** The most records a log may keep: past it a record's memory (a chunk's token ids) outweighs any router's need. */
export const MAX_KV_EVENT_LOG_SIZE = 1 << 22

/** The validated KV event settings (part of ServerConfigShape). */
export interface KvEventsConfig {
  /** Records kept (`--kv-event-log-size`); 0: events off, nothing recorded, every poll says `enabled: false`. */
  readonly kvEventLogSize: number
}

/** Default: upstream's log size. */
export const kvEventsDefaults: KvEventsConfig = { kvEventLogSize: 32768 }

/** Single-flag rules of the KV event flags (shared with the CLI's flag filters). */
export const kvEventsRules = {
  kvEventLogSize: (n: number) =>
    Number.isSafeInteger(n) && n >= 0 && n <= MAX_KV_EVENT_LOG_SIZE
      ? undefined
      : `must be an integer from 0 (events off) to ${MAX_KV_EVENT_LOG_SIZE} records (got ${n})`
} as const

/** Checks the KV event flags, pushing broken rules onto `issues`. */
export const validateKvEvents = (input: KvEventsConfig, issues: Array<ConfigIssue>): KvEventsConfig => {
  issueCheck(issues)("kv-event-log-size", kvEventsRules.kvEventLogSize(input.kvEventLogSize))
  return { kvEventLogSize: input.kvEventLogSize }
}
