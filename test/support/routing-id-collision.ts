/**
 * libzmq's routing-id collision, in a process of its own (it aborts), for test/integration/RoutingIdGuard.test.ts
 * (issue 24 item 1). A ROUTER on `endpoint` learns its counter from an in-process DEALER, a DEALER on `endpoint`
 * claims the id `ahead` steps past it, then `connections` DEALERs that set no id connect one by one, so the
 * counter walks over the claimed id.
 *
 * - mode "bare": a plain zeromq.js ROUTER (rand() never seeded): libzmq aborts when it generates the claimed id.
 * - mode "guarded": the server's ROUTER (src/layers/Zmq.ts bindRouter: seeded, probed) behind its door
 *   (PeerAdmission.ts), which kicks the claim before the counter gets there.
 *
 * Prints one JSON line: `{ first, claimed, admitted, refused, passedBy }` (ids as numbers; passedBy: how far the
 * counter went past the claim) when it survives.
 *
 *   node test/support/routing-id-collision.ts '{"mode":"bare"|"guarded","endpoint":"ipc://…","ahead":3,"connections":12}'
 */
import { Effect } from "effect"
import * as zmq from "zeromq"
import { bindRouter, setRoutingId } from "../../src/layers/Zmq.ts"
import { generatedCounterOf, generatedRoutingId } from "../../src/services/zmq/RoutingIds.ts"
import { makePeerAdmission } from "../../src/services/server/internal/PeerAdmission.ts"

const args = JSON.parse(process.argv[2] ?? "{}") as { mode: "bare" | "guarded"; endpoint: string; ahead: number; connections: number }

/** A DEALER that connects and says one frame, so the ROUTER sees it. */
const dealer = (routingId?: Buffer) => {
  const d = new zmq.Dealer({ linger: 0 })
  if (routingId !== undefined) setRoutingId(d, routingId)
  d.connect(args.endpoint)
  void d.send("hello").catch(() => undefined)
  return d
}

const bare = async () => {
  const router = new zmq.Router({ linger: 0 })
  ;(router as unknown as { setInt32Option(o: number, v: number): void }).setInt32Option(97, 3)
  await router.bind("inproc://probe")
  await router.bind(args.endpoint)
  const probe = new zmq.Dealer({ linger: 0 })
  probe.connect("inproc://probe")
  await probe.send("probe")
  const [probeId] = await router.receive()
  const first = generatedCounterOf(probeId!)!
  const claimed = first + args.ahead
  const sockets = [dealer(generatedRoutingId(claimed))]
  await router.receive() // its connect notification: the claim is held
  for (let i = 0; i < args.connections; i++) {
    sockets.push(dealer())
    await router.receive()
  }
  console.log(JSON.stringify({ first, claimed, admitted: args.connections, refused: 0 }))
  process.exit(0)
}

const guarded = Effect.scoped(Effect.gen(function*() {
  const bound = yield* bindRouter(args.endpoint, { sendHighWaterMark: 1000, lingerMs: 0 })
  const first = bound.firstGeneratedId
  const claimed = first + args.ahead
  const admittedPeers = new Set<string>()
  const admission = yield* makePeerAdmission(bound, (received) => Effect.sync(() => void admittedPeers.add(received[0]!.toString("hex"))), () => Effect.void)
  const receiveOne = Effect.gen(function*() {
    const received = yield* Effect.promise(() => bound.socket.receive())
    if (yield* admission.admit(received, received[0]!.toString("hex"))) admittedPeers.add(received[0]!.toString("hex"))
  })
  const sockets = [dealer(generatedRoutingId(claimed))]
  while (admission.stats().refused.ahead === 0) yield* receiveOne
  for (let i = 0; i < args.connections; i++) {
    sockets.push(dealer())
    const before = admittedPeers.size
    while (admittedPeers.size === before) yield* receiveOne
  }
  // How far the counter went: past the claimed id, or the run proves nothing.
  const last = Math.max(...[...admittedPeers].map((hex) => generatedCounterOf(Buffer.from(hex, "hex"))! - first))
  console.log(JSON.stringify({ first, claimed, admitted: admittedPeers.size, refused: admission.stats().refused.ahead, passedBy: last - args.ahead }))
  for (const s of sockets) s.close()
}))

if (args.mode === "bare") await bare()
else await Effect.runPromise(guarded)
