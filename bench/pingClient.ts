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
