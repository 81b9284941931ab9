#!/usr/bin/env python3
"""Subscribe to mpcache's KV event stream (``mpcache serve --kv-events-endpoint``) as vLLM's consumers do.

The stream is vLLM's own (``vllm/distributed/kv_events.py``): frames ``[topic, seq (8 bytes big-endian), payload]``,
the payload msgpack of ``KVEventBatch``. With msgspec installed the payload is decoded with vLLM's struct
definitions, copied below as vLLM's ``examples/online_serving/kv_events_subscriber.py`` copies them; without it,
with msgpack, reading the same array-like layout (tag first).

A subscriber that joins late, or sees a sequence gap, asks the replay ROUTER (``--kv-events-replay-endpoint``) for
every batch from the first one it lacks: ``["", start_seq]`` answered by ``["", seq, payload]`` … and
``["", END_SEQ, ""]``.

Prints one JSON line per event: ``{"seq", "type", "block_hashes" (hex), "parent_block_hash", "token_ids",
"block_size", "medium"}``, then exits after ``--count`` events (0: never). Exit 1 with the reason on stderr when
the server does not answer a replay within ``--timeout`` seconds.

    python3 examples/kv_events_subscriber.py --pub tcp://127.0.0.1:5557 --replay tcp://127.0.0.1:5558
"""
import argparse
import json
import sys
from typing import Any, Optional, Union

import zmq

END_SEQ = (-1).to_bytes(8, "big", signed=True)

try:
    import msgspec

    # Types as vLLM defines them (vllm.distributed.kv_events).
    ExternalBlockHash = Union[bytes, int]

    class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
        ts: float
        events: list[Any]

    class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
        """Base class for all KV cache-related events"""

    class BlockStored(KVCacheEvent):
        block_hashes: list[ExternalBlockHash]
        parent_block_hash: Optional[ExternalBlockHash]
        token_ids: list[int]
        block_size: int
        lora_id: Optional[int]
        medium: Optional[str]

    class BlockRemoved(KVCacheEvent):
        block_hashes: list[ExternalBlockHash]
        medium: Optional[str]

    class AllBlocksCleared(KVCacheEvent):
        pass

    class KVEventBatch(EventBatch):
        events: list[Union[BlockStored, BlockRemoved, AllBlocksCleared]]

    _decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
    DECODER = "msgspec"

    def decode(payload: bytes) -> list[dict]:
        out = []
        for e in _decoder.decode(payload).events:
            if isinstance(e, BlockStored):
                out.append({"type": "BlockStored", "block_hashes": e.block_hashes, "parent_block_hash": e.parent_block_hash,
                            "token_ids": e.token_ids, "block_size": e.block_size, "medium": e.medium})
            elif isinstance(e, BlockRemoved):
                out.append({"type": "BlockRemoved", "block_hashes": e.block_hashes, "medium": e.medium})
            else:
                out.append({"type": "AllBlocksCleared"})
        return out
except ImportError:
    import msgpack

    DECODER = "msgpack"

    def decode(payload: bytes) -> list[dict]:
        ts, events = msgpack.unpackb(payload, raw=False)[:2]
        if not isinstance(ts, (int, float)) or not isinstance(events, list):
            raise ValueError("not a KVEventBatch [ts, events]")
        out = []
        for e in events:
            tag = e[0]
            if tag == "BlockStored":
                out.append({"type": tag, "block_hashes": e[1], "parent_block_hash": e[2], "token_ids": e[3],
                            "block_size": e[4], "medium": e[6] if len(e) > 6 else None})
            elif tag == "BlockRemoved":
                out.append({"type": tag, "block_hashes": e[1], "medium": e[2] if len(e) > 2 else None})
            elif tag == "AllBlocksCleared":
                out.append({"type": tag})
            else:
                raise ValueError(f"unknown KV event tag {tag!r}")
        return out


def hex_hash(h: Any) -> Any:
    return h.hex() if isinstance(h, (bytes, bytearray)) else h


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pub", required=True, help="the server's --kv-events-endpoint")
    p.add_argument("--replay", required=True, help="the server's --kv-events-replay-endpoint")
    p.add_argument("--topic", default="kv-events")
    p.add_argument("--count", type=int, default=0, help="exit after this many events (0: never)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds a replay may take")
    args = p.parse_args()

    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.connect(args.pub)
    sub.setsockopt_string(zmq.SUBSCRIBE, args.topic)
    replay = ctx.socket(zmq.DEALER)
    replay.setsockopt(zmq.LINGER, 0)
    replay.connect(args.replay)
    print(f"subscribed to {args.pub} (decoder: {DECODER})", file=sys.stderr, flush=True)

    last_seq = -1
    printed = 0

    def apply(seq: int, payload: bytes) -> bool:
        nonlocal last_seq, printed
        if seq <= last_seq:
            return False  # already applied (a replay overlapping the live stream)
        last_seq = seq
        for event in decode(payload):
            event["seq"] = seq
            for k in ("block_hashes",):
                if k in event:
                    event[k] = [hex_hash(h) for h in event[k]]
            if "parent_block_hash" in event:
                event["parent_block_hash"] = hex_hash(event["parent_block_hash"])
            print(json.dumps(event), flush=True)
            printed += 1
            if args.count and printed >= args.count:
                return True
        return False

    def catch_up(start: int) -> bool:
        replay.send_multipart([b"", start.to_bytes(8, "big")])
        while True:
            if not replay.poll(int(args.timeout * 1000)):
                print(f"the replay ROUTER at {args.replay} did not answer within {args.timeout} s", file=sys.stderr)
                sys.exit(1)
            frames = replay.recv_multipart()
            _, seq_bytes, payload = frames[-3:]
            if seq_bytes == END_SEQ:
                return False
            if apply(int.from_bytes(seq_bytes, "big"), payload):
                return True

    # The last sequence number the SUB itself delivered: going back means the server restarted (a batch at or
    # below last_seq but above it was already brought by a replay, and apply() skips it).
    last_live = -1
    # A late joiner first asks for everything still buffered.
    if catch_up(0):
        return 0
    while True:
        _, seq_bytes, payload = sub.recv_multipart()
        seq = int.from_bytes(seq_bytes, "big")
        previous_live, last_live = last_live, seq
        if previous_live >= 0 and seq <= previous_live:
            # Numbers went back: the server restarted (its batch 0 says AllBlocksCleared); start over.
            print(f"sequence went back to {seq} after {last_seq}: the server restarted; replaying from 0", file=sys.stderr, flush=True)
            last_seq = -1
            if catch_up(0):
                return 0
            continue
        if seq > last_seq + 1:
            print(f"gap: missed {last_seq + 1} … {seq - 1}; replaying", file=sys.stderr, flush=True)
            if catch_up(last_seq + 1):
                return 0
        if apply(seq, payload):
            return 0


if __name__ == "__main__":
    sys.exit(main())
