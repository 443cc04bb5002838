"""
A blocking-socket NSQ V2 consumer for places without a reactor (the Spark driver).

:class:`BlockingConsumer` subscribes to one topic/channel on every nsqd given
(or found through nsqlookupd ``/lookup``), keeps the RDY window open, answers
heartbeats, reconnects with backoff and hands messages out of :meth:`poll`.
The caller decides when to :meth:`finish` them: the Spark source FINs only
after a message is fsynced to its spool.  Frames are decoded with
:mod:`nsqtw.protocol`; no Twisted, no threads of its own.  Not supported:
TLS, snappy and deflate (use a plaintext listener for Spark), AUTH is sent
when nsqd asks for it and a secret is configured.
"""

from __future__ import annotations

import json
import logging
import select
import selectors
import socket
import struct
import time
import urllib.request
from typing import Any
from collections.abc import Callable, Sequence
from urllib.parse import quote

from .. import __version__
from ..protocol.frames import FRAME_ERROR, FRAME_MESSAGE, FRAME_RESPONSE, HEARTBEAT, MAGIC_V2, FrameDecoder
from ..protocol.message import Message, decode_message

__all__ = ["BlockingConsumer", "NsqConnection", "lookup_producers", "ConsumerError"]

log = logging.getLogger("nsqtw.spark.consumer")

_I32 = struct.Struct(">i")


class ConsumerError(Exception):
    """A connection could not be set up (IDENTIFY, AUTH or SUB refused)."""


def _command(*parts: Any) -> bytes:
    return b" ".join(p if isinstance(p, bytes) else str(p).encode() for p in parts) + b"\n"


def _body_command(name: str, body: bytes) -> bytes:
    return name.encode() + b"\n" + _I32.pack(len(body)) + body


class NsqConnection:
    """One V2 connection: blocking setup, then non-blocking reads driven by the consumer."""

    def __init__(self, address: tuple[str, int], topic: str, channel: str, identify: dict[str, Any],
                 connect_timeout: float = 5.0, auth_secret: str | None = None,
                 max_frame: int = 64 * 1024 * 1024) -> None:
        self.address = address
        self.topic = topic
        self.channel = channel
        self.decoder = FrameDecoder(max_frame)
        self.rdy = 0
        self.in_flight = 0
        self.closed = False
        self.peer_closed = False
        self.max_rdy_count = 2500
        sock = socket.create_connection(address, timeout=connect_timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self._pending: list[tuple[int, bytes]] = []
        try:
            sock.sendall(MAGIC_V2)
            sock.sendall(_body_command("IDENTIFY", json.dumps(identify).encode()))
            data = self._expect_response("IDENTIFY")
            features: dict[str, Any] = {}
            if data != b"OK":
                features = json.loads(data)
                self.max_rdy_count = int(features.get("max_rdy_count", self.max_rdy_count))
            if features.get("auth_required"):
                if not auth_secret:
                    raise ConsumerError(f"{self}: nsqd requires AUTH and no auth secret is configured")
                sock.sendall(_body_command("AUTH", auth_secret.encode()))
                self._expect_response("AUTH")
            sock.sendall(_command("SUB", topic, channel))
            self._expect_response("SUB")
        except BaseException:
            sock.close()
            raise
        sock.setblocking(False)

    def __repr__(self) -> str:
        return f"<nsqd {self.address[0]}:{self.address[1]} {self.topic}/{self.channel}>"

    def _expect_response(self, what: str) -> bytes:
        while True:
            for ftype, data in self._read_frames_blocking():
                if ftype == FRAME_RESPONSE and data == HEARTBEAT:
                    self.sock.sendall(b"NOP\n")
                    continue
                if ftype == FRAME_ERROR:
                    raise ConsumerError(f"{self}: {what} failed: {data.decode(errors='replace')}")
                if ftype == FRAME_RESPONSE:
                    return data
                self._pending.append((ftype, data))

    def _read_frames_blocking(self) -> list[tuple[int, bytes]]:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"{self}: closed during setup")
        return self.decoder.feed(chunk)

    def fileno(self) -> int:
        return self.sock.fileno()

    def read(self) -> list[tuple[int, bytes]]:
        """Frames available now (non-blocking); raises ConnectionError when the peer closed."""
        frames, self._pending = self._pending, []
        while True:
            try:
                chunk = self.sock.recv(1 << 20)
            except (BlockingIOError, InterruptedError):
                break
            if not chunk:
                if frames:
                    self.peer_closed = True
                    break
                raise ConnectionError(f"{self}: closed by nsqd")
            frames.extend(self.decoder.feed(chunk))
            if len(chunk) < (1 << 20):
                break
        return frames

    def send(self, data: bytes) -> None:
        """Blocking write of a command (commands are small; a full buffer waits briefly)."""
        view = memoryview(data)
        deadline = time.monotonic() + 30.0
        while view:
            try:
                n = self.sock.send(view)
                view = view[n:]
            except (BlockingIOError, InterruptedError):
                if time.monotonic() > deadline:
                    raise ConnectionError(f"{self}: write timed out") from None
                select.select([], [self.sock], [], 1.0)

    def set_rdy(self, count: int) -> None:
        count = max(0, min(count, self.max_rdy_count))
        if count != self.rdy:
            self.send(_command("RDY", count))
            self.rdy = count

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self.sock.close()
            except OSError:  # pragma: no cover
                pass


def lookup_producers(lookupd: str, topic: str, timeout: float = 5.0) -> list[tuple[str, int]]:
    """nsqlookupd ``/lookup?topic=``: the producers' (broadcast_address, tcp_port)."""
    base = lookupd if "://" in lookupd else "http://" + lookupd
    url = f"{base.rstrip('/')}/lookup?topic={quote(topic, safe='')}"
    req = urllib.request.Request(url, headers={"Accept": "application/vnd.nsq; version=1.0"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            doc = json.loads(resp.read())
    except urllib.error.HTTPError as e:
        if e.code == 404:  # topic not known yet
            return []
        raise
    data = doc.get("data", doc) if isinstance(doc, dict) else {}
    return [(p["broadcast_address"], int(p["tcp_port"])) for p in data.get("producers") or []]


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


class BlockingConsumer:
    """Consume one topic/channel from nsqd addresses or lookupd; drive it with :meth:`poll`."""

    def __init__(self, topic: str, channel: str, *, nsqd_tcp_addresses: Sequence[str] = (),
                 lookupd_http_addresses: Sequence[str] = (), max_in_flight: int = 200,
                 heartbeat_interval: float = 30.0, msg_timeout: float | None = None,
                 lookupd_poll_interval: float = 60.0, connect_timeout: float = 5.0,
                 auth_secret: str | None = None, client_id: str | None = None,
                 user_agent: str | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        if not nsqd_tcp_addresses and not lookupd_http_addresses:
            raise ValueError("give nsqd TCP addresses or nsqlookupd HTTP addresses")
        self.topic = topic
        self.channel = channel
        self.nsqd = [_split(a) for a in nsqd_tcp_addresses]
        self.lookupd = list(lookupd_http_addresses)
        self.max_in_flight = max_in_flight
        self.lookupd_poll_interval = lookupd_poll_interval
        self.connect_timeout = connect_timeout
        self.auth_secret = auth_secret
        self.clock = clock
        host = socket.gethostname()
        self.identify: dict[str, Any] = {
            "client_id": client_id or host.split(".")[0],
            "hostname": host,
            "user_agent": user_agent or f"nsqtw-spark/{__version__}",
            "feature_negotiation": True,
            "heartbeat_interval": int(heartbeat_interval * 1000),
        }
        if msg_timeout:
            self.identify["msg_timeout"] = int(msg_timeout * 1000)
        self.conns: dict[tuple[str, int], NsqConnection] = {}
        self._retry_at: dict[tuple[str, int], float] = {}
        self._backoff: dict[tuple[str, int], float] = {}
        self._next_lookup = 0.0
        self._known: list[tuple[str, int]] = list(self.nsqd)
        self.paused = False
        self.selector = selectors.DefaultSelector()
        self.errors: list[str] = []
        self.heartbeats = 0
        self.connects = 0

    # --- connections ------------------------------------------------------------

    def _targets(self) -> list[tuple[str, int]]:
        now = self.clock()
        if self.lookupd and now >= self._next_lookup:
            self._next_lookup = now + self.lookupd_poll_interval
            for lookupd in self.lookupd:
                try:
                    for addr in lookup_producers(lookupd, self.topic):
                        if addr not in self._known:
                            self._known.append(addr)
                except Exception as e:
                    log.warning("lookupd %s query failed: %s", lookupd, e)
        return self._known

    def _connect_missing(self) -> None:
        now = self.clock()
        for addr in self._targets():
            if addr in self.conns or self._retry_at.get(addr, 0.0) > now:
                continue
            try:
                conn = NsqConnection(addr, self.topic, self.channel, self.identify, self.connect_timeout,
                                     self.auth_secret)
            except (OSError, ConsumerError) as e:
                delay = min(self._backoff.get(addr, 0.5) * 2, 30.0)
                self._backoff[addr] = delay
                self._retry_at[addr] = now + delay
                self.errors.append(str(e))
                log.warning("connecting to %s:%s failed (%s); retrying in %.1fs", addr[0], addr[1], e, delay)
                continue
            self._backoff.pop(addr, None)
            self._retry_at.pop(addr, None)
            self.conns[addr] = conn
            self.connects += 1
            self.selector.register(conn.sock, selectors.EVENT_READ, conn)
            log.info("connected to %s", conn)
            self._update_rdy()

    def _drop(self, conn: NsqConnection, reason: Any) -> None:
        log.warning("%s lost: %s", conn, reason)
        try:
            self.selector.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.close()
        self.conns.pop(conn.address, None)
        self._retry_at[conn.address] = self.clock() + 1.0
        self._update_rdy()

    def _update_rdy(self) -> None:
        if not self.conns:
            return
        per = 0 if self.paused else max(1, self.max_in_flight // len(self.conns))
        for conn in list(self.conns.values()):
            try:
                conn.set_rdy(per)
            except OSError as e:
                self._drop(conn, e)

    def pause(self, paused: bool) -> None:
        """RDY 0 on every connection (backpressure), or the window back."""
        if paused != self.paused:
            self.paused = paused
            self._update_rdy()

    # --- the loop -----------------------------------------------------------------

    def poll(self, timeout: float) -> list[tuple[NsqConnection, Message]]:
        """Wait up to ``timeout`` for messages; heartbeats are answered on the way."""
        self._connect_missing()
        if not self.conns:
            time.sleep(min(timeout, 0.1))
            return []
        out: list[tuple[NsqConnection, Message]] = []
        for key, _ in self.selector.select(timeout):
            conn: NsqConnection = key.data
            try:
                frames = conn.read()
            except (OSError, ConnectionError) as e:
                self._drop(conn, e)
                continue
            except Exception as e:  # a bad frame: the stream is unusable
                self._drop(conn, e)
                continue
            for ftype, data in frames:
                if ftype == FRAME_MESSAGE:
                    conn.in_flight += 1
                    out.append((conn, decode_message(data)))
                elif ftype == FRAME_RESPONSE:
                    if data == HEARTBEAT:
                        self.heartbeats += 1
                        try:
                            conn.send(b"NOP\n")
                        except OSError as e:
                            self._drop(conn, e)
                            break
                elif ftype == FRAME_ERROR:
                    text = data.decode(errors="replace")
                    self.errors.append(text)
                    log.warning("%s: %s", conn, text)
            if conn.peer_closed and not conn.closed:
                self._drop(conn, "closed by nsqd")
        return out

    def finish(self, conn: NsqConnection, message_id: bytes) -> None:
        if conn.closed:
            return  # nsqd requeued it when the connection dropped
        try:
            conn.send(b"FIN " + message_id + b"\n")
            conn.in_flight = max(0, conn.in_flight - 1)
        except OSError as e:
            self._drop(conn, e)

    def finish_many(self, items: Sequence[tuple[NsqConnection, Message]]) -> None:
        """FIN a batch with one write per connection."""
        by_conn: dict[int, tuple[NsqConnection, list[bytes]]] = {}
        for conn, msg in items:
            by_conn.setdefault(id(conn), (conn, []))[1].append(b"FIN " + msg.id + b"\n")
        for conn, cmds in by_conn.values():
            if conn.closed:
                continue
            try:
                conn.send(b"".join(cmds))
                conn.in_flight = max(0, conn.in_flight - len(cmds))
            except OSError as e:
                self._drop(conn, e)

    def close(self) -> None:
        for conn in list(self.conns.values()):
            try:
                self.selector.unregister(conn.sock)
            except (KeyError, ValueError):
                pass
            conn.close()
        self.conns.clear()
        self.selector.close()
