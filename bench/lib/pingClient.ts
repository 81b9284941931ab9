/**
 * The benches' raw PING clients: zeromq.js DEALERs speaking wire protocol v1
 * with no mpcache client code in between, so that what they time is the
 * socket, the kernel and the server. The op id and the frames come from the
 * op table and the frame codec (src/schema/Op.ts `Ping`, src/schema/Frame.ts),
 * never from literals here.
 *
 * - `pingLoop`: one PING in flight, the next sent on its reply (bench:ping).
 * - `pacedPingLoop`: one PING every N ms whatever the replies do, recording
 *   while a flag is set (bench/lib/pingChild.ts, for bench:transfer).
 * - `phasedPingLoop`: closed or open loop, each round trip recorded into the
 *   phase its PING was sent in (bench:liveness part 2).
 *
 * All round trips are in microseconds, from the send to the reply's arrival.
 * With CURVE keys (`pingLoop`'s `curve`), the DEALER speaks CURVE and binds
 * its connection with HELLO (docs/security.md) before the first PING, which
 * is not timed.
 */
import { Exit } from "effect"
import { Dealer } from "zeromq"
import type { InstanceId } from "../../src/schema/InstanceId.ts"
import { decodeReplyHeader, decodeResponse, encodeRequest, pack, unpack } from "../../src/schema/Frame.ts"
import { Hello, HelloChallenge, type Op, type PayloadOf, Ping, type ResponseOf } from "../../src/schema/Op.ts"
import { helloProof } from "../../src/services/auth/Curve.ts"
import type { DealerCurve } from "../../src/services/zmq/Sockets.ts"
import { sleep } from "./time.ts"

/**
 * What answers the PINGs: `mpcache` replies with PING's response (`true`);
 * `echo` (bench/lib/echo-router.ts) sends the request back, so its "response" is
 * the request's own payload frame (nil, or the instance id of a named PING).
 */
export type Responder = "mpcache" | "echo"

/** The op and payload frames of a PING [`instanceId`], encoded once through the op table's Schemas. */
export const pingTail = (instanceId: InstanceId | null): ReadonlyArray<Buffer> => {
  const frames = encodeRequest(Ping, 0, [instanceId])
  if (Exit.isFailure(frames)) throw new Error(`cannot encode PING [${instanceId}]`)
  return frames.value.slice(1)
}

/** The request `[uid, op, instance_id]`: only the uid frame is packed per PING. */
const pingRequest = (uid: number, tail: ReadonlyArray<Buffer>): Array<Buffer> => [pack(uid), ...tail]

const show = (frames: ReadonlyArray<Uint8Array>): string =>
  JSON.stringify(frames.map((f) => unpack(f)?.value), (_, v: unknown) => typeof v === "bigint" ? v.toString() : v)

/**
 * Checks `reply` is PING's success reply `[uid, op, response]` with the
 * response `responder` sends (the echo: the PING's `instanceId`), and returns
 * its uid; throws, showing the decoded frames, on anything else (an error
 * reply, another op, another response).
 */
export const readPingReply = (reply: ReadonlyArray<Uint8Array>, responder: Responder, instanceId: InstanceId | null = null): number => {
  const header = decodeReplyHeader(reply)
  const expected = responder === "mpcache" ? true : instanceId
  if (header === undefined || header._tag !== "Ok" || header.opId !== Ping.id || header.body.length !== 1) {
    throw new Error(`unexpected reply to a PING: ${show(reply)}`)
  }
  const response = unpack(header.body[0]!)
  if (response === undefined || response.value !== expected) throw new Error(`unexpected reply to a PING: ${show(reply)}`)
  return header.uid
}

/** Shared state of one measurement by `pingLoop` / `pacedPingLoop`: flip `measuring` to record, `stopped` to end. */
export interface PingRun {
  measuring: boolean
  stopped: boolean
  /** Round trips in microseconds, recorded while `measuring`. */
  readonly latenciesUs: Array<number>
  /** Paced clients: PINGs sent while measuring whose replies are not in yet (set by `pacedPingLoop`). */
  outstanding?: () => number
}

/** Send and receive timeouts of `pingLoop` and `pacedPingLoop`, ms: a silent server fails the run. */
const TIMEOUT_MS = 5_000

/** One request and its decoded reply over a raw DEALER; throws on an error reply or a timeout. */
const exchange = async <O extends Op>(dealer: Dealer, op: O, uid: number, payload: PayloadOf<O>): Promise<ResponseOf<O>> => {
  const frames = encodeRequest(op, uid, payload)
  if (Exit.isFailure(frames)) throw new Error(`cannot encode ${op.name}`)
  await dealer.send(frames.value)
  const reply = await dealer.receive()
  const header = decodeReplyHeader(reply)
  if (header === undefined || header._tag !== "Ok") throw new Error(`${op.name} failed: ${show(reply)}`)
  const response = decodeResponse(op, header.body)
  if (Exit.isFailure(response)) throw new Error(`${op.name}: a reply that does not decode: ${show(reply)}`)
  return response.value
}

/** HELLO_CHALLENGE then HELLO with the proof over the nonce: binds the DEALER's connection to its key's tenant. */
const hello = async (dealer: Dealer, curve: DealerCurve): Promise<void> => {
  const nonce = await exchange(dealer, HelloChallenge, 0, [])
  await exchange(dealer, Hello, 1, [curve.publicKey, new Uint8Array(helloProof(curve.secretKey, curve.serverPublicKey, nonce))])
}

/** A bench DEALER with the send and receive timeouts (a silent server fails the run), CURVE keys when given. */
const benchDealer = (timeouts: { readonly sendTimeout: number; readonly receiveTimeout: number }, curve?: DealerCurve) =>
  new Dealer({
    linger: 0,
    ...timeouts,
    ...(curve === undefined ? {} : { curveServerKey: curve.serverPublicKey, curveSecretKey: curve.secretKey, curvePublicKey: curve.publicKey })
  })

/**
 * One client: a DEALER with exactly one PING [`instanceId`] (default nil) in
 * flight until `run.stopped`. A reply other than `responder`'s throws. With
 * `curve`, it speaks CURVE and says HELLO first.
 */
export const pingLoop = async (
  endpoint: string,
  run: PingRun,
  responder: Responder,
  curve?: DealerCurve,
  instanceId: InstanceId | null = null
): Promise<void> => {
  const dealer = benchDealer({ sendTimeout: TIMEOUT_MS, receiveTimeout: TIMEOUT_MS }, curve)
  const tail = pingTail(instanceId)
  try {
    dealer.connect(endpoint)
    if (curve !== undefined) await hello(dealer, curve)
    for (let uid = 0; !run.stopped; uid++) {
      const start = process.hrtime.bigint()
      await dealer.send(pingRequest(uid, tail))
      const reply = await dealer.receive()
      const end = process.hrtime.bigint()
      const got = readPingReply(reply, responder, instanceId)
      if (got !== uid) throw new Error(`reply to PING ${got} while PING ${uid} was in flight`)
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
export const pacedPingLoop = async (endpoint: string, run: PingRun, intervalMs: number, responder: Responder): Promise<void> => {
  const dealer = new Dealer({ linger: 0, sendTimeout: TIMEOUT_MS, receiveTimeout: TIMEOUT_MS })
  const tail = pingTail(null)
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
      dealer.send(pingRequest(id, tail)).then(
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
        const rUid = readPingReply(reply, responder)
        const start = sentAt.get(rUid)
        if (start === undefined) throw new Error(`reply to PING ${rUid}, which is not in flight`)
        sentAt.delete(rUid)
        if (measured.delete(rUid)) run.latenciesUs.push(Number(end - start) / 1000)
      }
    } finally {
      clearInterval(timer)
    }
    if (failure !== undefined) throw failure
  } finally {
    dealer.close()
  }
}

/** `closed`: one PING in flight, the next sent on its reply; `open`: one sent every `intervalMs` regardless. */
export type ClientMode = "closed" | "open"

/** Shared state of one `phasedPingLoop`. */
export interface PhasedRun {
  /** Where the round trips of PINGs sent now go (undefined: warm-up, not measured). */
  into: Array<number> | undefined
  /** Replies received while true are counted (answered rate). */
  counting: boolean
  answered: number
  stopped: boolean
}

/** Options of `phasedPingLoop`: the pace of the open loop and the DEALER's timeouts, ms. */
export interface PhasedOptions {
  readonly intervalMs: number
  readonly sendTimeoutMs: number
  /** A PING without a reply this long fails the run. */
  readonly replyTimeoutMs: number
}

/**
 * One DEALER sending PING [`instanceId`] to mpcache. `closed`: exactly one
 * in flight (as bench:ping). `open`: one every `intervalMs` on a fixed grid
 * whatever the replies do — heartbeats of many workers do not wait for each
 * other — with the replies received on the side, so a server stall delays
 * every PING sent during it and each is a sample (a closed-loop client sees
 * one per stall). A round trip runs from the actual send and counts in the
 * phase the PING was sent in (`run.into`). Once `run.stopped` it sends no
 * more and waits for every reply outstanding.
 */
export const phasedPingLoop = async (
  endpoint: string,
  instanceId: InstanceId,
  run: PhasedRun,
  mode: ClientMode,
  options: PhasedOptions
): Promise<void> => {
  const dealer = new Dealer({ linger: 0, sendTimeout: options.sendTimeoutMs, receiveTimeout: options.replyTimeoutMs })
  const tail = pingTail(instanceId)
  const sent = new Map<number, { readonly at: bigint; readonly into: Array<number> | undefined }>()
  const receiveOne = async (): Promise<void> => {
    const reply = await dealer.receive()
    const end = process.hrtime.bigint()
    const rUid = readPingReply(reply, "mpcache")
    const request = sent.get(rUid)
    if (request === undefined) throw new Error(`reply to PING ${rUid}, which is not in flight: ${show(reply)}`)
    sent.delete(rUid)
    request.into?.push(Number(end - request.at) / 1000)
    if (run.counting) run.answered++
  }
  const send = (uid: number) => {
    sent.set(uid, { at: process.hrtime.bigint(), into: run.into })
    return dealer.send(pingRequest(uid, tail))
  }
  try {
    dealer.connect(endpoint)
    if (mode === "closed") {
      for (let uid = 0; !run.stopped; uid++) {
        await send(uid)
        await receiveOne()
      }
      return
    }
    let sending = true
    const receiver = (async () => {
      while (sending || sent.size > 0) await receiveOne()
    })()
    const sender = (async () => {
      const start = performance.now()
      for (let uid = 0; !run.stopped; uid++) {
        const wait = start + uid * options.intervalMs - performance.now()
        if (wait > 0) await sleep(wait)
        await send(uid)
      }
    })().finally(() => {
      sending = false
    })
    await Promise.all([sender, receiver])
  } finally {
    dealer.close()
  }
}
