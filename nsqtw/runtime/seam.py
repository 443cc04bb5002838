"""
The one place nsqtw reads Twisted's private attributes: the TCP transport's
buffers and socket, the epoll reactor's poller, twistd's exit signal, and two
of twisted.web's HTTP channel (the path of the request whose headers are being
read, and its answer to a malformed request).

Each use is guarded: it checks that the attributes it needs are there (a
Twisted release that renamed them turns the speed-up off, never breaks a
connection), and everything else in nsqtw uses Twisted's public interfaces.

The socket seam
---------------

Two things make a request/answer broker fast on Twisted's TCP transport, and
both need its private state:

* **the eager write**: Twisted's ``write`` only buffers; the bytes go out in
  the next reactor iteration, after two ``epoll`` modifications (start and stop
  writing).  When nothing is waiting in the transport's buffers the answer can
  be sent with one ``send()`` at once (as asyncio's transports do); what the
  socket does not take goes through ``transport.write``, so order and
  backpressure stay Twisted's.
* **the reused-buffer read**: Twisted's ``doRead`` is
  ``socket.recv(bufferSize)``, which allocates the whole buffer size for every
  read, however small.  Reading into one preallocated buffer and copying out
  what arrived costs one small allocation.  Errors, EOF and EAGAIN are
  answered as ``tcp.Connection.doRead`` answers them.

A :class:`SocketSeam` attaches only where this is known to be right: an
exact, unwrapped :class:`twisted.internet.tcp.Server` (no subclass, no
``ProtocolWrapper`` of a ``WrappingFactory``, no TLS layer) whose protocol
is the caller's own and which provides no ``ISSLTransport``.  Anywhere else
:func:`attach` returns None and the caller writes through ``transport.write``.
It detaches before ``startTLS`` and on close.  ``NSQTW_FAST_IO=0`` in the
environment (or :data:`ENABLED` set to False) turns it off everywhere.
"""

from __future__ import annotations

import os
from errno import EWOULDBLOCK
from typing import Any
from collections.abc import Callable

from twisted.internet import tcp
from twisted.internet.interfaces import ISSLTransport
from twisted.internet.main import CONNECTION_DONE, CONNECTION_LOST

__all__ = ["SocketSeam", "attach", "attach_client", "ENABLED", "READ_SIZE", "epoll_parts", "clear_exit_signal",
           "request_path", "bad_request", "missing"]

#: the one switch: False makes :func:`attach` attach nothing (plain Twisted I/O everywhere)
ENABLED = os.environ.get("NSQTW_FAST_IO", "1") != "0"

#: bytes read per system call: fewer, larger reads for publishers
READ_SIZE = 256 * 1024

_READ_BUF = bytearray(READ_SIZE)
_READ_VIEW = memoryview(_READ_BUF)


class SocketSeam:
    """The eager write and the reused-buffer read of one plain TCP connection."""

    __slots__ = ("transport", "write", "writev", "_do_read", "attached")

    def __init__(self, transport: tcp.Server | tcp.Client, data_received: Callable[[bytes], None]) -> None:
        self.transport = transport
        self.attached = True
        sock = transport.socket
        send = sock.send
        sendmsg = sock.sendmsg
        recv_into = sock.recv_into
        fallback = transport.write
        fallback_seq = transport.writeSequence
        view = _READ_VIEW
        seam = self

        def write(data: bytes) -> None:
            t = transport
            if not seam.attached or t._tempDataLen or t.offset != len(t.dataBuffer) \
                    or not t.connected or t.disconnecting or t._aborting or t._writeDisconnected:
                fallback(data)  # buffered, closing or gone: Twisted decides
                return
            try:
                sent = send(data)
            except OSError:  # EAGAIN, or an error the transport's own write path reports
                fallback(data)
                return
            if sent < len(data):
                fallback(data[sent:])

        def writev(parts: list[bytes]) -> None:
            """:func:`write` of the parts joined, without joining them (one ``sendmsg``)."""
            t = transport
            if not seam.attached or t._tempDataLen or t.offset != len(t.dataBuffer) \
                    or not t.connected or t.disconnecting or t._aborting or t._writeDisconnected:
                fallback_seq(parts)
                return
            try:
                sent = sendmsg(parts)
            except OSError:
                fallback_seq(parts)
                return
            if sent == sum(map(len, parts)):
                return
            for i, part in enumerate(parts):
                if sent < len(part):
                    fallback_seq([part[sent:], *parts[i + 1:]])
                    return
                sent -= len(part)

        def do_read() -> Any:
            try:
                n = recv_into(view)
            except OSError as se:
                if se.args[0] == EWOULDBLOCK:
                    return None
                return CONNECTION_LOST
            if not n:
                return CONNECTION_DONE
            data_received(view[:n].tobytes())
            return None

        self.write: Callable[[bytes], None] = write
        self.writev: Callable[[list[bytes]], None] = writev
        self._do_read = do_read
        transport.bufferSize = READ_SIZE
        transport.doRead = do_read  # type: ignore[method-assign]  # an instance attribute shadows the method

    def detach(self) -> None:
        """Back to Twisted's own reads and writes (before ``startTLS``, and on close)."""
        if not self.attached:
            return
        self.attached = False
        t = self.transport
        if t.__dict__.get("doRead") is self._do_read:  # abortConnection may have replaced it
            del t.doRead


#: what the seam reads of a tcp.Server (checked on every connection it attaches to)
_SERVER_NEEDS = ("socket", "_tempDataLen", "dataBuffer", "offset", "connected", "disconnecting",
                 "_aborting", "_writeDisconnected", "TLS", "protocol", "doRead")
#: of those, the ones a tcp.Server sets on itself (not class attributes: checked per connection)
_SERVER_INSTANCE_NEEDS = ("socket", "_tempDataLen", "protocol")


def attach_client(transport: Any, data_received: Callable[[bytes], None]) -> SocketSeam | None:
    """A :class:`SocketSeam` on an outgoing plain TCP connection (``tcp.Client``, e.g. one an
    endpoint connected, whose protocol may be the endpoint's forwarding wrapper): the caller's
    ``data_received`` gets what is read."""
    if not ENABLED or type(transport) is not tcp.Client:
        return None
    if not all(hasattr(transport, name) for name in _SERVER_NEEDS):
        return None
    if ISSLTransport.providedBy(transport) or transport.TLS or transport.socket is None:
        return None
    return SocketSeam(transport, data_received)


def attach(transport: Any, protocol: Any, data_received: Callable[[bytes], None]) -> SocketSeam | None:
    """A :class:`SocketSeam` on ``transport`` if it is a plain TCP connection of ``protocol``'s."""
    if not ENABLED or type(transport) is not tcp.Server:
        return None
    if not all(hasattr(transport, name) for name in _SERVER_NEEDS):
        return None  # a Twisted whose transport differs: plain Twisted I/O
    if transport.protocol is not protocol or ISSLTransport.providedBy(transport) or transport.TLS:
        return None
    if transport.socket is None:
        return None
    return SocketSeam(transport, data_received)


# --- the epoll reactor's poll (for nsqtw.runtime.spinreactor) ------------------------------------------

def epoll_parts(reactor: Any) -> tuple[Callable[..., Any], dict[int, Any], Callable[[Any, int, int], None]]:
    """``(poll, selectables by fd, handle one event)`` of an ``EPollReactor``: what a
    ``doPoll`` of its own needs.  Raises ``TypeError`` naming what is missing."""
    missing = [name for name in ("_poller", "_selectables", "_doReadOrWrite") if not hasattr(reactor, name)]
    if missing:
        raise TypeError(f"this Twisted's EPollReactor has no {', '.join(missing)}: "
                        "nsqtw's spin reactor cannot run on it (use Twisted's epoll reactor)")
    return reactor._poller.poll, reactor._selectables, reactor._doReadOrWrite


# --- twistd ------------------------------------------------------------------------------------

def clear_exit_signal(reactor: Any) -> None:
    """Make twistd exit with the status nsqtw sets rather than the signal that stopped the
    reactor (twistd reads ``reactor._exitSignal`` after the reactor returns)."""
    if getattr(reactor, "_exitSignal", None) is not None:
        reactor._exitSignal = None


# --- twisted.web's HTTP channel (for nsqtw.runtime.responses) ---------------------------------

def request_path(channel: Any) -> bytes | None:
    """The path (with its query) of the request whose headers ``channel`` is reading:
    ``HTTPChannel._path``, the only place it is known before the body is read.  None on a
    Twisted that keeps it elsewhere: the caller then bounds the body by the largest limit of
    any path and lets the route refuse it once read (see :func:`missing`)."""
    path = getattr(channel, "_path", None)
    return path if isinstance(path, bytes) else None


def bad_request(channel: Any) -> None:
    """Answer ``400 Bad Request`` and close, as Twisted's HTTP channel answers a malformed
    request (``HTTPChannel._respondToBadRequestAndDisconnect``; the same bytes are written here
    on a Twisted without it)."""
    respond = getattr(channel, "_respondToBadRequestAndDisconnect", None)
    if callable(respond):
        respond()
        return
    channel.transport.write(b"HTTP/1.1 400 Bad Request\r\n\r\n")
    channel.loseConnection()


def missing() -> list[str]:
    """The private Twisted attributes this module reads that the installed Twisted lacks
    (each use then falls back as its function says: slower or later, never broken).  Empty on
    every Twisted nsqtw is tested with; the test suite fails when it is not."""
    from twisted.internet import epollreactor
    from twisted.internet.testing import StringTransport
    from twisted.web.http import HTTPChannel

    absent = [f"tcp.Server.{name}" for name in _SERVER_NEEDS
              if not hasattr(tcp.Server, name) and name not in _SERVER_INSTANCE_NEEDS]
    reactor_class = epollreactor.EPollReactor
    absent += [f"EPollReactor.{name}" for name in ("_doReadOrWrite",) if not hasattr(reactor_class, name)]
    channel = HTTPChannel()
    channel.makeConnection(StringTransport())
    try:
        channel.dataReceived(b"GET /probe HTTP/1.1\r\n")
        if request_path(channel) != b"/probe":
            absent.append("HTTPChannel._path")
    finally:
        channel.connectionLost(CONNECTION_DONE)
    if not callable(getattr(channel, "_respondToBadRequestAndDisconnect", None)):
        absent.append("HTTPChannel._respondToBadRequestAndDisconnect")
    return absent
