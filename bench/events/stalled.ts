/**
 * bench:events' stalled subscriber, in a process of its own as a router would be (events.ts forks it): connects a
 * SUB to argv[2] with a receive high-water mark of 1, subscribes to everything, says `connected` to its parent and
 * never reads (its queue and socket buffers fill; the PUB drops its copies past them). Ends when its parent kills it.
 */
import * as zmq from "zeromq"

const sub = new zmq.Subscriber({ linger: 0, receiveHighWaterMark: 1 })
sub.connect(process.argv[2]!)
sub.subscribe("")
process.send!("connected")
// Kept alive by the socket; the parent's SIGKILL ends it.
