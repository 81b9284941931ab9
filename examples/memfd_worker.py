#!/usr/bin/env python3
"""An mpcache worker in Python: a KV cache in sealed memfds, handed over, not named.

    python3 memfd_worker.py [endpoint] [--hold]      (default tcp://127.0.0.1:5555)

It speaks the wire protocol of DESIGN §3 with pyzmq and msgpack only (no
mpcache package), and the descriptor exchange of docs/memfd.md with the
standard library (os.memfd_create, fcntl seals, socket.send_fds):

1. a DEALER connects; GET_CHUNK_SIZE, then GET_SERVER_INFO (op 67) names the
   descriptor socket and this connection's fd_nonce;
2. one memfd per layer (memfd_create + ftruncate + F_SEAL_SHRINK|F_SEAL_GROW|
   F_SEAL_SEAL), mmapped, the first blocks of K and V filled with a known pattern;
3. the descriptors go over the descriptor socket in SCM_RIGHTS with
   {version: 1, nonce, instance_id, fds}; the reply's one-time token goes into
   the cpu_memfd descriptors of REGISTER_KV_CACHE;
4. STORE those blocks, zero them, LOOKUP + QUERY_PREFETCH_STATUS, RETRIEVE into
   the same blocks and compare the whole cache byte for byte (the pattern where
   it was, zeros elsewhere); END_SESSION, UNREGISTER_KV_CACHE.

stdout (exit 0) is one JSON line, e.g. against `mpcache serve --chunk-size 64`:
    {"instance_id": "…", "pid": …, "chunk_size": 64, "layers": 2, "blocks": 16,
     "memfd_bytes": 32768, "seals_seen_by_server": [7, 7], "stored_tokens": 128,
     "store_ok": true, "hit_tokens": 128, "retrieve_ok": true,
     "bytes_verified": 65536, "bytes_differing": 0}
An error reply, a refused descriptor request or a timeout prints
`memfd_worker: …` on stderr and exits 1; so does a mismatch, after the JSON.

`--hold` waits for a line on stdin after the bytes are verified and before
UNREGISTER (announced on stderr), so that /api/status can be read while the
instance is registered (test/e2e/pythonExample.test.ts does).

CURVE off only: a server with --curve wants a CURVE handshake and a tenant
HELLO (X25519 + HMAC, docs/security.md), which need more than the standard
library; this example does neither. Linux only (memfd, SCM_RIGHTS, SO_PEERCRED).
"""
import fcntl
import hashlib
import json
import mmap
import os
import socket
import struct
import sys
import time

import msgpack
import zmq

# Op ids of DESIGN §3.1 (upstream's frozen numbering; 64+ are mpcache's own).
REGISTER_KV_CACHE, UNREGISTER_KV_CACHE, STORE, RETRIEVE, LOOKUP = 1, 2, 6, 7, 8
QUERY_PREFETCH_STATUS, END_SESSION, GET_CHUNK_SIZE, GET_SERVER_INFO = 9, 13, 21, 67
ERROR_MARKER = b"MPCACHE_ERR"  # raw ASCII, not MessagePack
TIMEOUT_S = 10.0

MODEL, WORLD_SIZE, KV_RANK = "python-example", 1, 0
LAYERS, BLOCK_TOKENS, HEADS, HEAD_SIZE, DTYPE, DTYPE_BYTES = 2, 16, 2, 16, "float16", 2
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


class Failure(Exception):
    """Anything that ends the example with exit 1."""


class Client:
    """One DEALER; requests one at a time, so every reply answers the last request."""

    def __init__(self, endpoint):
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 1000)
        self.sock.connect(endpoint)
        self.uid = 0

    def request(self, op, *payload):
        """Sends [uid, op, p0 … pn-1], each its own MessagePack value; returns the response (None if absent)."""
        self.uid += 1
        self.sock.send_multipart([msgpack.packb(v) for v in (self.uid, op, *payload)])
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0 or not self.sock.poll(left_ms):
                raise Failure(f"op {op}: no reply within {TIMEOUT_S} s (is the server at this endpoint?)")
            frames = self.sock.recv_multipart()
            # A lone empty frame is the server's probe (is this connection alive, does it read its replies), not a reply.
            if frames != [b""]:
                break
        uid, got_op = msgpack.unpackb(frames[0]), msgpack.unpackb(frames[1])
        if (uid, got_op) != (self.uid, op):
            raise Failure(f"op {op}: a reply for uid {uid} op {got_op}, expected uid {self.uid}")
        if len(frames) == 4 and frames[2] == ERROR_MARKER:
            body = msgpack.unpackb(frames[3])
            raise Failure(f"{body['code']}: {body['message']}")  # the server's message names the op
        return msgpack.unpackb(frames[2]) if len(frames) > 2 else None


def sealed_memfd(name, nbytes):
    """A memfd of nbytes zeros that can neither shrink nor grow, and takes no further seals."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, nbytes)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
    return fd


def hand_over(path, nonce, instance_id, fds):
    """One request on the descriptor socket: a 4-byte big-endian length + a MessagePack map, fds in SCM_RIGHTS."""
    body = msgpack.packb({"version": 1, "nonce": nonce, "instance_id": instance_id, "fds": len(fds)})
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(TIMEOUT_S)
        s.connect("\0" + path[1:] if path.startswith("@") else path)  # "@name": the abstract namespace
        socket.send_fds(s, [struct.pack(">I", len(body)) + body], fds)
        reply = b""
        while len(reply) < 4 or len(reply) < 4 + struct.unpack(">I", reply[:4])[0]:
            chunk = s.recv(65536)
            if not chunk:
                raise Failure(f"descriptor socket {path}: closed before a whole reply")
            reply += chunk
    answer = msgpack.unpackb(reply[4:])
    if not answer.get("ok"):
        raise Failure(f"descriptor socket {path}: {answer.get('code')}: {answer.get('message')}")
    return answer


def pattern(layer, kv, nbytes):
    """Deterministic bytes that differ from block to block, so a misplaced block cannot pass."""
    return hashlib.shake_256(f"{MODEL}/layer {layer}/kv {kv}".encode()).digest(nbytes)


def main(endpoint, hold):
    client = Client(endpoint)
    chunk = client.request(GET_CHUNK_SIZE)
    info = client.request(GET_SERVER_INFO)
    if "cpu_memfd" not in info["features"] or not info["fd_socket"]:
        raise Failure(f"the server takes no memfd descriptors (features: {', '.join(info['features']) or 'none'}); start it with --fd-socket")

    tokens = 2 * chunk  # two complete chunks stored, in blocks [0, stored_blocks)
    stored_blocks, blocks = tokens // BLOCK_TOKENS, 2 * tokens // BLOCK_TOKENS
    block_bytes = BLOCK_TOKENS * HEADS * HEAD_SIZE * DTYPE_BYTES
    layer_bytes = 2 * blocks * block_bytes  # [2, blocks, BLOCK_TOKENS, HEADS, HEAD_SIZE]: K then V
    span = stored_blocks * block_bytes

    fds = [sealed_memfd(f"mpcache-py-{os.getpid()}-L{layer}", layer_bytes) for layer in range(LAYERS)]
    maps = [mmap.mmap(fd, layer_bytes) for fd in fds]
    for layer, m in enumerate(maps):
        for kv in (0, 1):
            start = kv * blocks * block_bytes
            m[start:start + span] = pattern(layer, kv, span)
    expected = [bytes(m) for m in maps]

    instance_id = int.from_bytes(os.urandom(8), "big") >> 1  # 63 random bits
    granted = hand_over(info["fd_socket"], info["fd_nonce"], instance_id, fds)

    def descriptor(index):  # layer `index` is the whole of passed descriptor `index`
        return {
            "kind": "cpu_memfd", "fd_token": granted["token"], "fd_index": index, "device_uuid": "cpu",
            "nbytes": layer_bytes, "dtype": DTYPE, "shape": [2, blocks, BLOCK_TOKENS, HEADS, HEAD_SIZE],
            "stride": [blocks * BLOCK_TOKENS * HEADS * HEAD_SIZE, BLOCK_TOKENS * HEADS * HEAD_SIZE, HEADS * HEAD_SIZE, HEAD_SIZE, 1],
            "storage_offset": 0,
        }

    client.request(REGISTER_KV_CACHE, instance_id, [descriptor(i) for i in range(LAYERS)], MODEL, WORLD_SIZE, "python", {}, [])

    token_ids = [(i * 31 + 7) % 32000 for i in range(tokens)]

    def key(request_id, worker_id, end):  # worker_id None: a scheduler's LOOKUP (every rank)
        return {
            "model_name": MODEL, "world_size": WORLD_SIZE, "worker_id": worker_id, "token_ids": token_ids,
            "start": 0, "end": end, "request_id": request_id, "cache_salt": "",
        }

    event = b"py-event"
    handle, store_ok = client.request(STORE, key("py-store", KV_RANK, tokens), instance_id, [list(range(stored_blocks))], event)
    if handle != event:
        raise Failure(f"STORE echoed event handle {handle!r}, sent {event!r}")

    for m in maps:
        m[:] = bytes(layer_bytes)
    client.request(LOOKUP, key("py-retrieve", None, tokens), WORLD_SIZE)
    deadline = time.monotonic() + TIMEOUT_S
    while (hit_chunks := client.request(QUERY_PREFETCH_STATUS, "py-retrieve")) is None:  # nil: still pending
        if time.monotonic() > deadline:
            raise Failure(f"LOOKUP still pending after {TIMEOUT_S} s")
        time.sleep(0.001)
    hit = hit_chunks * chunk
    _, retrieve_ok = client.request(RETRIEVE, key("py-retrieve", KV_RANK, hit), instance_id, [list(range(hit // BLOCK_TOKENS))], event, 0)
    client.request(END_SESSION, "py-retrieve")

    differing = sum(a != b for m, want in zip(maps, expected) for a, b in zip(bytes(m), want))
    if hold:
        print(f"memfd_worker: holding instance {instance_id} (pid {os.getpid()}); a line on stdin unregisters", file=sys.stderr, flush=True)
        sys.stdin.readline()
    client.request(UNREGISTER_KV_CACHE, instance_id)
    for m in maps:
        m.close()
    for fd in fds:
        os.close(fd)

    result = {
        "instance_id": str(instance_id), "pid": os.getpid(), "chunk_size": chunk, "layers": LAYERS, "blocks": blocks,
        "memfd_bytes": layer_bytes, "seals_seen_by_server": [f["seals"] for f in granted["fds"]],
        "stored_tokens": tokens, "store_ok": store_ok, "hit_tokens": hit, "retrieve_ok": retrieve_ok,
        "bytes_verified": LAYERS * layer_bytes, "bytes_differing": differing,
    }
    print(json.dumps(result), flush=True)
    if not (store_ok and retrieve_ok and hit == tokens and differing == 0):
        raise Failure(f"the cache did not come back intact: {result}")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--hold"]
    try:
        main(args[0] if args else "tcp://127.0.0.1:5555", "--hold" in sys.argv[1:])
    except (Failure, OSError, zmq.ZMQError) as e:
        print(f"memfd_worker: {e}", file=sys.stderr)
        sys.exit(1)
    finally:
        zmq.Context.instance().destroy(linger=0)
