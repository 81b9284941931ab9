/**
 * bench:events' fast subscriber, in a process of its own as a router would be (events.ts forks it): connects a SUB
 * to argv[2], decodes every batch, and tells its parent over the IPC channel when it hears a record (`heard`, so the
 * parent knows its subscription is in place) and when it has counted argv[3] `BlockStored` events of argv[4] tokens
 * since the parent said `start` (`done`).
 */
import * as zmq from "zeromq"
import { decodeKvEventBatch, KvEventBatchInvalid } from "../../src/schema/VllmKvEvents.ts"

const [endpoint, recordsText, chunkText] = process.argv.slice(2)
const records = Number(recordsText)
const chunk = Number(chunkText)
const send = (m: unknown) => process.send!(m)
const sub = new zmq.Subscriber({ linger: 0, receiveHighWaterMark: 0 })
sub.connect(endpoint!)
sub.subscribe("")
let counting = false
let received = 0
process.on("message", (m) => {
  if (m === "start") {
    counting = true
    received = 0
  }
})
let heard = false
for await (const [, , payload] of sub) {
  const b = decodeKvEventBatch(payload!)
  if (b instanceof KvEventBatchInvalid) throw new Error(b.reason)
  if (!heard) {
    heard = true
    send("heard")
  }
  if (!counting) continue
  for (const e of b.events) if (e._tag === "BlockStored" && e.tokenIds.length === chunk) received++
  if (received >= records) {
    send("done")
    break
  }
}
sub.close()
process.disconnect()
