"""The least a Python process can do for a replicated PUB: a floor under nsqtw's replicated pair.

Two tiny programs with no broker in them (the relay on raw ``epoll``, the peer on a blocking socket):

* ``relay`` speaks just enough of NSQ's protocol V2 for Go's ``bench_pub``/``bench_writer``
  (the magic, ``PUB``, ``MPUB``, the ``OK`` frame).  Alone it answers each command at once
  (the floor of an unreplicated nsqd); with ``--peer`` it sends each turn's bodies to the peer
  as one length-prefixed batch and answers ``OK`` only when the peer's 8-byte acknowledgement
  comes back (the floor of a replicated nsqd: the same hops as nsqtw's origin, no work).
* ``peer`` appends each batch to a file with one ``write`` and acknowledges it.

``bench/bench_replication.py`` starts them and runs Go's bench tools and its dual-publish client
against the pair beside nsqtw's: about the most any Python implementation of a
peer-acknowledged publish can reach on this machine, whatever its broker costs.
``FLOOR_SPIN_US=50`` makes the relay poll for 50 µs before it sleeps, as nsqd's reactor does.
"""

from __future__ import annotations

import argparse
import os
import select
import socket
import struct
import sys
import time

OK = b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
ACK = struct.Struct(">Q")
LEN = struct.Struct(">I")


def listen(port: int) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen(64)
    s.setblocking(False)
    return s


def parse(buf: bytearray) -> tuple[int, list[bytes]]:
    """Complete commands at the front of ``buf``: (bytes used, bodies)."""
    pos, n = 0, len(buf)
    bodies: list[bytes] = []
    if buf[:4] == b"  V2":
        pos = 4
    while True:
        nl = buf.find(b"\n", pos)
        if nl < 0 or nl + 5 > n:
            return pos, bodies
        size = LEN.unpack_from(buf, nl + 1)[0]
        end = nl + 5 + size
        if end > n:
            return pos, bodies
        bodies.append(bytes(buf[nl + 5:end]))  # PUB's body, or MPUB's whole payload
        pos = end


def relay(port: int, peer: str | None) -> None:
    ep = select.epoll()
    lsock = listen(port)
    ep.register(lsock.fileno(), select.EPOLLIN)
    clients: dict[int, tuple[socket.socket, bytearray]] = {}
    link = None
    if peer:
        host, _, p = peer.rpartition(":")
        link = socket.create_connection((host, int(p)))
        link.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        link.setblocking(False)
        ep.register(link.fileno(), select.EPOLLIN)
    waiting: list[list[socket.socket]] = []  # per batch sent, the clients to answer
    ackbuf = bytearray()
    seq = 0
    spin = float(os.environ.get("FLOOR_SPIN_US", "0")) / 1e6
    while True:
        events = ep.poll(0) if spin else None
        if spin:
            end = time.perf_counter() + spin
            while not events and time.perf_counter() < end:
                events = ep.poll(0)
        if not events:
            events = ep.poll()
        batch: list[bytes] = []
        answer: list[socket.socket] = []
        for fd, _ in events:
            if fd == lsock.fileno():
                c, _a = lsock.accept()
                c.setblocking(False)
                c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                clients[c.fileno()] = (c, bytearray())
                ep.register(c.fileno(), select.EPOLLIN)
            elif link is not None and fd == link.fileno():
                data = link.recv(65536)
                if not data:
                    return
                ackbuf += data
                k = len(ackbuf) // 8
                del ackbuf[:k * 8]
                for _ in range(k):
                    for c in waiting.pop(0):
                        c.send(OK)
            else:
                c, buf = clients[fd]
                data = c.recv(1 << 20)
                if not data:
                    ep.unregister(fd)
                    c.close()
                    del clients[fd]
                    continue
                buf += data
                used, bodies = parse(buf)
                del buf[:used]
                if bodies:
                    if link is None:
                        c.send(OK * len(bodies))
                    else:
                        batch.extend(bodies)
                        answer.extend([c] * len(bodies))
        if batch and link is not None:
            seq += 1
            parts = [LEN.pack(len(b)) + b for b in batch]
            payload = b"".join(parts)
            link.sendall(ACK.pack(seq) + LEN.pack(len(payload)) + payload)
            waiting.append(answer)


def peer_main(port: int, path: str) -> None:
    lsock = listen(port)
    lsock.setblocking(True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    while True:  # one link at a time (a readiness probe connects and closes first)
        conn, _ = lsock.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        serve_link(conn, fd)
        conn.close()


def serve_link(conn: socket.socket, fd: int) -> None:
    buf = bytearray()
    while True:
        data = conn.recv(1 << 20)
        if not data:
            return
        buf += data
        pos, acks = 0, []
        while len(buf) - pos >= 12:
            size = LEN.unpack_from(buf, pos + 8)[0]
            if len(buf) - pos < 12 + size:
                break
            os.write(fd, buf[pos:pos + 12 + size])
            acks.append(buf[pos:pos + 8])
            pos += 12 + size
        del buf[:pos]
        if acks:
            conn.sendall(b"".join(acks))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("relay", help="the origin's part: answers OK (after the peer's ACK with --peer)")
    r.add_argument("--port", type=int, required=True)
    r.add_argument("--peer", help="HOST:PORT of a running peer")
    p = sub.add_parser("peer", help="the peer's part: appends each batch to --file and acknowledges it")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--file", required=True)
    a = ap.parse_args()
    if a.cmd == "relay":
        relay(a.port, a.peer)
    else:
        peer_main(a.port, a.file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
