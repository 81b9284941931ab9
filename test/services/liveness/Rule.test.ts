/**
 * The liveness rule (src/services/liveness/Rule.ts, DESIGN §5) at its
 * boundaries: each window keeps an entry silent exactly that long and reaps
 * it 1 ms later; the disconnect grace likewise, from the later of the
 * disconnect and the last message; and the state table.
 *
 * Windows are the defaults in ms: reap timeout 120 s, registration grace
 * 3600 s, disconnect grace 10 s.
 */
import { assert, describe, it } from "@effect/vitest"
import { judge } from "../../../src/services/liveness/InstanceRegistry.ts"
import {
  disconnectVerdict,
  heartbeatStateOf,
  lifecycle,
  outlived,
  stateOf,
  timeVerdict,
  verdictOf,
  windowMsOf,
  windowsOf,
  type Liveness,
  type Windows
} from "../../../src/services/liveness/Rule.ts"
import { makeInstanceId } from "../../../src/schema/InstanceId.ts"

const w: Windows = { reapTimeoutMs: 120_000, registrationGraceMs: 3_600_000, disconnectGraceMs: 10_000 }

/** Last seen at 1 000 ms, with the given flags. */
const entry = (hasLivenessSignal: boolean, hasTransferActivity: boolean): Liveness => ({ lastSeenMs: 1_000, hasLivenessSignal, hasTransferActivity })
const active = entry(true, true)
const registered = entry(false, false)

describe("windows", () => {
  it("the flags' seconds become ms", () => {
    assert.deepStrictEqual(
      windowsOf({ workerReapTimeoutSeconds: 120, workerRegistrationGraceSeconds: 3600, workerDisconnectGraceSeconds: 10 }),
      w
    )
  })

  it("the reap timeout applies only when both flags are latched; otherwise the registration grace", () => {
    assert.deepStrictEqual(
      [entry(false, false), entry(true, false), entry(false, true), entry(true, true)].map((t) => windowMsOf(heartbeatStateOf(t), w)),
      [3_600_000, 3_600_000, 3_600_000, 120_000]
    )
    assert.strictEqual(windowMsOf("suspect", w), 10_000)
  })
})

describe("staleness: silent strictly longer than the window", () => {
  it("outlived is strict", () => {
    assert.deepStrictEqual([outlived(11, 1, 10), outlived(12, 1, 10), outlived(1, 5, 0)], [false, true, false])
  })

  it("active: kept at exactly the reap timeout, reaped 1 ms past it (reason timeout)", () => {
    assert.strictEqual(timeVerdict(active, 121_000, w), undefined)
    assert.deepStrictEqual(timeVerdict(active, 121_001, w), { reason: "timeout", silentMs: 120_001, windowMs: 120_000 })
  })

  it("startup (never pinged): kept at exactly the registration grace, reaped 1 ms past it (reason grace)", () => {
    assert.strictEqual(timeVerdict(registered, 3_601_000, w), undefined)
    assert.deepStrictEqual(timeVerdict(registered, 3_601_001, w), { reason: "grace", silentMs: 3_600_001, windowMs: 3_600_000 })
  })

  it("pinged but never transferring keeps the grace: not reaped past the reap timeout", () => {
    assert.strictEqual(timeVerdict(entry(true, false), 121_001, w), undefined)
    assert.deepStrictEqual(timeVerdict(entry(true, false), 3_601_001, w), { reason: "grace", silentMs: 3_600_001, windowMs: 3_600_000 })
  })

  it("reap timeout 0 turns both heartbeat windows off", () => {
    const off = { ...w, reapTimeoutMs: 0 }
    assert.deepStrictEqual([timeVerdict(active, 1e12, off), timeVerdict(registered, 1e12, off)], [undefined, undefined])
  })
})

describe("disconnect: suspect longer than the disconnect grace", () => {
  it("kept at exactly the grace after the disconnect, reaped 1 ms past it", () => {
    assert.strictEqual(disconnectVerdict(active, 5_000, 15_000, w), undefined)
    assert.deepStrictEqual(disconnectVerdict(active, 5_000, 15_001, w), { reason: "disconnect", silentMs: 10_001, windowMs: 10_000 })
  })

  it("a message after the disconnect restarts the grace from that message", () => {
    const seenLater: Liveness = { ...active, lastSeenMs: 8_000 }
    assert.strictEqual(disconnectVerdict(seenLater, 5_000, 18_000, w), undefined)
    assert.deepStrictEqual(disconnectVerdict(seenLater, 5_000, 18_001, w), { reason: "disconnect", silentMs: 10_001, windowMs: 10_000 })
  })

  it("not suspect, or disconnect grace 0: never a disconnect reap", () => {
    assert.strictEqual(disconnectVerdict(active, undefined, 1e12, w), undefined)
    assert.strictEqual(disconnectVerdict(active, 5_000, 1e12, { ...w, disconnectGraceMs: 0 }), undefined)
  })

  it("a suspect past both its disconnect grace and its heartbeat window is reaped for the disconnect", () => {
    assert.deepStrictEqual(verdictOf(active, 1_000, 121_001, w), { reason: "disconnect", silentMs: 120_001, windowMs: 10_000 })
  })

  it("a suspect within its disconnect grace is still reaped by its heartbeat window", () => {
    assert.deepStrictEqual(verdictOf(active, 120_000, 121_001, w), { reason: "timeout", silentMs: 120_001, windowMs: 120_000 })
    assert.strictEqual(verdictOf(active, 120_000, 121_000, w), undefined)
  })

  it("the registry's judge is the rule with the suspects looked up, and the entry attached", () => {
    const t = { ...active, id: makeInstanceId(7n), resource: "r" }
    const rule = { ...w, nowMs: 15_001, suspects: new Map([[7n, 5_000]]) }
    assert.deepStrictEqual(judge(t, rule), { tracked: t, reason: "disconnect", silentMs: 10_001, windowMs: 10_000 })
    assert.strictEqual(judge(t, { ...rule, suspects: new Map() }), undefined)
  })
})

describe("the state table", () => {
  it("startup until both flags are latched, then active; suspect whenever no bound connection is left", () => {
    assert.deepStrictEqual(
      [entry(false, false), entry(true, false), entry(false, true), entry(true, true)].map((t) => [stateOf(t, false), stateOf(t, true)]),
      [["startup", "suspect"], ["startup", "suspect"], ["startup", "suspect"], ["active", "suspect"]]
    )
  })

  it("each state's window, reap reason, edges to other states and edges into the single release", () => {
    assert.deepStrictEqual(
      Object.entries(lifecycle).map(([state, row]) => [state, row.window, row.reap, Object.keys(row.to), row.release]),
      [
        ["startup", "registrationGraceMs", "grace", ["active", "suspect"], ["grace", "unregister", "shutdown"]],
        ["active", "reapTimeoutMs", "timeout", ["suspect"], ["timeout", "unregister", "shutdown"]],
        ["suspect", "disconnectGraceMs", "disconnect", ["startup", "active"], ["disconnect", "grace", "timeout", "unregister", "shutdown"]]
      ]
    )
  })
})
