/** A raw PING client for the benches: a zeromq.js DEALER speaking wire protocol v1 with no mpcache code in between. */
import { Packr } from "msgpackr"
import { Dealer } from "zeromq"

const packr = new Packr({ useRecords: false, int64AsType: "bigint" })
const OP_PING = 22
const OP_FRAME = packr.pack(OP_PING)
const NIL_FRAME = packr.pack(null)

/** Shared state of one measurement: flip `measuring` to record, `stopped` to end. */
export interface PingRun {
  measuring: boolean
  stopped: boolean
  /** Round trips in microseconds, recorded while `measuring`. */
  readonly latenciesUs: Array<number>
  /** Paced clients: PINGs sent while measuring whose replies are not in yet (set by `pacedPingLoop`). */
  outstanding?: () => number
}

/**
 * One client: a DEALER with exactly one PING [nil] in flight until
 * `run.stopped`. `expected` is the decoded response frame (`true` from
 * mpcache, the echoed `null` from an echo server); anything else throws.
 */
export const pingLoop = async (endpoint: string, run: PingRun, expected: unknown = true): Promise<void> => {
  const dealer = new Dealer({ linger: 0, sendTimeout: 5_000, receiveTimeout: 5_000 })
  try {
    dealer.connect(endpoint)
    for (let uid = 0; !run.stopped; uid++) {
      const start = process.hrtime.bigint()
      await dealer.send([packr.pack(uid), OP_FRAME, NIL_FRAME])
      const reply = await dealer.receive()
      const end = process.hrtime.bigint()
      const [rUid, rOp, rResponse] = reply.map((frame): unknown => packr.unpack(frame))
      if (reply.length !== 3 || rUid !== uid || rOp !== OP_PING || rResponse !== expected) {
        throw new Error(`unexpected reply to PING ${uid}: ${JSON.stringify([rUid, rOp, rResponse])}`)
      }
      if (run.measuring) run.latenciesUs.push(Number(end - start) / 1000)
    }
  } finally {
    dealer.close()
  }
}

/**
 * A paced client: one PING [nil] every `intervalMs` whatever the replies do
 * (several may be in flight; replies are matched by uid), as the heartbeats of
 * many workers would arrive. Unlike `pingLoop` it adds a fixed, light load, so
 * the probe does not compete for the CPU with what it measures. Each round
 * trip is timed from its own send. Ends when `run.stopped` and every reply is in.
 */
export const pacedPingLoop = async (endpoint: string, run: PingRun, intervalMs: number, expected: unknown = true): Promise<void> => {
  const dealer = new Dealer({ linger: 0, sendTimeout: 5_000, receiveTimeout: 5_000 })
  const sentAt = new Map<number, bigint>()
  const measured = new Set<number>()
  run.outstanding = () => measured.size
  let failure: Error | undefined
  try {
    dealer.connect(endpoint)
    let uid = 0
    let sending = false
    const timer = setInterval(() => {
      if (run.stopped || sending) return
      const id = uid++
      sending = true
      sentAt.set(id, process.hrtime.bigint())
      if (run.measuring) measured.add(id)
      dealer.send([packr.pack(id), OP_FRAME, NIL_FRAME]).then(
        () => {
          sending = false
        },
        (error: unknown) => {
          failure ??= error instanceof Error ? error : new Error(String(error))
        }
      )
    }, intervalMs)
    try {
      while (failure === undefined && !(run.stopped && sentAt.size === 0)) {
        const reply = await dealer.receive()
        const end = process.hrtime.bigint()
        const [rUid, rOp, rResponse] = reply.map((frame): unknown => packr.unpack(frame))
        const start = typeof rUid === "number" ? sentAt.get(rUid) : undefined
        if (reply.length !== 3 || start === undefined || rOp !== OP_PING || rResponse !== expected) {
          throw new Error(`unexpected reply to a PING: ${JSON.stringify([rUid, rOp, rResponse])}`)
        }
        sentAt.delete(rUid as number)
        if (measured.delete(rUid as number)) run.latenciesUs.push(Number(end - start) / 1000)
      }
    } finally {
      clearInterval(timer)
    }
    if (failure !== undefined) throw failure
  } finally {
    dealer.close()
  }
}
