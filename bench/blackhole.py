"""A TCP proxy with a blackhole switch: a silent network partition on loopback.

The replication proof (``bench/replication_proof.py --fault=partition``) points an origin's
``--replica-peer`` at this proxy instead of the peer.  While healed, bytes are forwarded both
ways as they come (a half-close is passed on as a half-close, a reset as a reset).  ``cut()``
stops forwarding in both directions and keeps every socket open: nothing arrives, nothing is
closed (no FIN, no RST), as when a switch or a firewall drops packets.  What was written
meanwhile stays in the sockets' buffers, and a connection accepted meanwhile is not passed on
to the target, as TCP would keep retransmitting and resending SYN; ``heal()`` lets it all
through again (each side then finds out what the other did meanwhile, as after a real
partition heals).

    proxy = Blackhole(("127.0.0.1", peer_port))   # listens on 127.0.0.1:proxy.port
    proxy.cut(); ...; proxy.heal()
    proxy.close()

One thread and ``select``; nothing here is imported by nsqtw.
"""

from __future__ import annotations

import select
import socket
import struct
import threading

#: bytes held for one direction before the proxy stops reading its source (back pressure)
LIMIT = 1 << 20


class _Pipe:
    """One proxied connection: the accepted socket and the one to the target."""

    def __init__(self, client: socket.socket) -> None:
        self.ends: list[socket.socket | None] = [client, None]
        #: bytes read from end i, waiting to be written to the other end
        self.buf = [bytearray(), bytearray()]
        #: end i said EOF (its bytes are passed on, then the other end is shut for writing)
        self.eof = [False, False]
        self.shut = [False, False]

    def connect(self, target: tuple[str, int]) -> None:
        try:
            self.ends[1] = socket.create_connection(target, timeout=5)
        except OSError:
            self.close(reset=True)
            return
        for s in self.ends:
            assert s is not None
            s.setblocking(False)

    def close(self, reset: bool = False) -> None:
        for s in self.ends:
            if s is None:
                continue
            if reset:  # pass a reset on as a reset
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()
        self.ends = [None, None]

    @property
    def closed(self) -> bool:
        return self.ends[0] is None

    def done(self) -> bool:
        return all(self.eof) and not any(self.buf)


class Blackhole:
    """A proxy to ``target`` listening on ``127.0.0.1:port`` (chosen by the kernel)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.setblocking(False)
        self.port: int = self.listener.getsockname()[1]
        self._cut = threading.Event()
        self._stop = threading.Event()
        self._pipes: list[_Pipe] = []
        #: connections accepted while cut, passed on to the target once healed
        self._waiting: list[_Pipe] = []
        self.accepted = 0
        self._thread = threading.Thread(target=self._run, name="blackhole", daemon=True)
        self._thread.start()

    def cut(self) -> None:
        """Stop forwarding in both directions; every socket stays open."""
        self._cut.set()

    def heal(self) -> None:
        self._cut.clear()

    @property
    def is_cut(self) -> bool:
        return self._cut.is_set()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for p in self._pipes + self._waiting:
            p.close()
        self.listener.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            cut = self._cut.is_set()
            if not cut and self._waiting:
                for p in self._waiting:
                    p.connect(self.target)
                    if not p.closed:
                        self._pipes.append(p)
                self._waiting = []
            readers: list[socket.socket] = [self.listener]
            writers: list[socket.socket] = []
            where: dict[socket.socket, tuple[_Pipe, int]] = {}
            if not cut:
                for p in self._pipes:
                    for i in (0, 1):
                        src, dst = p.ends[i], p.ends[1 - i]
                        assert src is not None and dst is not None
                        where[src] = (p, i)
                        where[dst] = (p, 1 - i)
                        if not p.eof[i] and len(p.buf[i]) < LIMIT:
                            readers.append(src)
                        if p.buf[i]:
                            writers.append(dst)
            try:
                readable, writable, _ = select.select(readers, writers, [], 0.05)
            except (OSError, ValueError):
                continue
            if self._cut.is_set() != cut:
                continue  # switched while waiting: nothing moves in the wrong state
            for s in readable:
                if s is self.listener:
                    self._accept()
                else:
                    self._read(*where[s])
            for s in writable:
                p, i = where[s]
                self._write(p, 1 - i)
            self._pipes = [p for p in self._pipes if not p.closed]

    def _accept(self) -> None:
        try:
            client, _ = self.listener.accept()
        except OSError:
            return
        self.accepted += 1
        p = _Pipe(client)
        if self._cut.is_set():
            self._waiting.append(p)
            return
        p.connect(self.target)
        if not p.closed:
            self._pipes.append(p)

    def _read(self, p: _Pipe, i: int) -> None:
        src = p.ends[i]
        if src is None:
            return
        try:
            data = src.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            p.close(reset=True)
            return
        if data:
            p.buf[i] += data
        else:
            p.eof[i] = True
        self._write(p, i)

    def _write(self, p: _Pipe, i: int) -> None:
        """Pass end ``i``'s bytes on to the other end (and its EOF once they are all written)."""
        dst = p.ends[1 - i]
        if dst is None:
            return
        if p.buf[i]:
            try:
                sent = dst.send(p.buf[i])
            except BlockingIOError:
                return
            except OSError:
                p.close(reset=True)
                return
            del p.buf[i][:sent]
        if p.eof[i] and not p.buf[i] and not p.shut[i]:
            p.shut[i] = True
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        if p.done():
            p.close()
