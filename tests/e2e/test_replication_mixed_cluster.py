"""A mixed cluster with replication (issue 26): one nsqlookupd (nsqtw's, and Go's 1.3.0 when its
binary is there), one Go nsqd 1.3.0 and an nsqtw replicated pair, all on loopback port 0.

A stock consumer (nsqtw's client, polling nsqlookupd) finds the topic on Go's nsqd and on the
nsqtw origin and gets the messages of both; the peer, while its origin lives, is not listed and
delivers nothing.  Then the origin stops with messages still in flight to that consumer; once
the peer adopts them, the consumer's next lookupd poll finds the peer, and it gets them from
there, while Go's nsqd keeps delivering its own."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
import treq
from twisted.internet import defer, reactor, task
from twisted.internet.protocol import ProcessProtocol

from nsqtw.client import Config, Consumer
from nsqtw.embed import start_nsqd
from nsqtw.lookupd.embed import start_nsqlookupd
from nsqtw.testing import body_command, connect_raw

from replication_support import free_port, until

pytestmark = pytest.mark.e2e

GO = Path(__file__).resolve().parents[3] / "shared" / "anchors" / "go-nsq-1.3.0"


class _Process(ProcessProtocol):
    def __init__(self) -> None:
        self.ended: defer.Deferred = defer.Deferred()

    def processEnded(self, reason: Any) -> None:
        self.ended.callback(None)


async def spawn_go(binary: str, args: list[str], ping: str, tmp: Path) -> tuple[Any, _Process]:
    proto = _Process()
    argv = [str(GO / binary), *args]
    process = reactor.spawnProcess(proto, argv[0], argv, env={}, path=str(tmp))
    for _ in range(250):
        try:
            r = await treq.get(f"http://{ping}/ping", persistent=False)
            await r.content()
            if r.code == 200:
                return process, proto
        except Exception:
            pass
        await task.deferLater(reactor, 0.04, lambda: None)
    process.signalProcess("KILL")
    raise AssertionError(f"Go's {binary} did not answer /ping")


# skipped here, not in the fixture: a skip raised inside pytest-twisted's async fixture errors instead
pytestmark = pytest.mark.skipif(not (os.access(GO / "nsqd", os.X_OK) and os.access(GO / "nsqlookupd", os.X_OK)),
                                reason=f"Go's nsqd and nsqlookupd 1.3.0 are not in {GO} (builds of NSQ 1.3.0's daemons)")


@pytest_twisted.async_yield_fixture(params=["nsqtw-lookupd", "go-lookupd"])
async def cluster(request, tmp_path):
    """(lookupd http address, lookupd tcp address, Go nsqd tcp port, Go nsqd http address)."""
    procs: list[tuple[Any, _Process]] = []
    lookupd = None
    try:
        if request.param == "go-lookupd":
            ltcp, lhttp = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
            (tmp_path / "lookupd").mkdir()
            procs.append(await spawn_go("nsqlookupd", [f"--tcp-address={ltcp}", f"--http-address={lhttp}",
                                                       "--broadcast-address=127.0.0.1"], lhttp, tmp_path / "lookupd"))
        else:
            lookupd = await start_nsqlookupd()
            ltcp, lhttp = lookupd.tcp_address, lookupd.http_address
        gtcp, ghttp = free_port(), f"127.0.0.1:{free_port()}"
        (tmp_path / "go").mkdir()
        procs.append(await spawn_go("nsqd", [f"--tcp-address=127.0.0.1:{gtcp}", f"--http-address={ghttp}",
                                             "--broadcast-address=127.0.0.1", f"--data-path={tmp_path / 'go'}",
                                             f"--lookupd-tcp-address={ltcp}"], ghttp, tmp_path / "go"))
        yield lhttp, ltcp, gtcp, ghttp
    finally:
        for process, proto in reversed(procs):
            if not proto.ended.called:
                process.signalProcess("KILL")
            await proto.ended
        if lookupd is not None:
            await lookupd.stop()


async def go_pub(http: str, body: bytes) -> None:
    r = await treq.post(f"http://{http}/pub?topic=t", body, persistent=False)
    assert r.code == 200, await r.content()
    await r.content()


@pytest_twisted.ensureDeferred
async def test_a_lookupd_consumer_gets_go_and_nsqtw_messages_then_the_adopted_ones(cluster):
    lhttp, ltcp, gtcp, ghttp = cluster
    peer = await start_nsqd(replication_insecure=True, node_id=2, replication_address="127.0.0.1:0", adopt_after=0.5,
                            broadcast_address="127.0.0.1", lookupd_tcp_addresses=[ltcp])
    origin = await start_nsqd(replication_insecure=True, node_id=1, replica_peers=[f"127.0.0.1:{peer._service.replication_port}"],
                              broadcast_address="127.0.0.1", lookupd_tcp_addresses=[ltcp])
    consumer = None
    try:
        await until(lambda: origin._service.replication.origin.in_sync() == 1)
        p = await connect_raw(origin.tcp_port)
        for body in (b"nsqtw-early", b"late-1", b"late-2", b"late-3"):
            p.send(body_command("PUB", "t", body=body))
            assert await p.response() == b"OK"  # on the origin and in the peer's shadow
        await p.close()
        await go_pub(ghttp, b"go-1")

        got: list[tuple[bytes, str]] = []
        held: list[Any] = []
        origin_addr = f"127.0.0.1:{origin.tcp_port}"

        def handle(m: Any) -> None:
            if m.body.startswith(b"late") and m.nsqd_address == origin_addr:
                m.disable_auto_response()  # in flight when the origin goes: never finished there
                held.append(m)
                return
            got.append((m.body, m.nsqd_address))

        consumer = Consumer("t", "c", handle, Config(max_in_flight=10, lookupd_poll_interval=0.1))
        await consumer.connect_to_nsqlookupd(lhttp)
        await until(lambda: len(got) == 2 and len(held) == 3)
        assert sorted(got) == [(b"go-1", f"127.0.0.1:{gtcp}"), (b"nsqtw-early", origin_addr)]
        # the peer delivers nothing while its origin lives (no lookupd registration, no consumers)
        assert f"127.0.0.1:{peer.tcp_port}" not in {m.nsqd_address for m in held}
        await until(lambda: peer._service.shadow_files.states[1].count() == 3)  # the FIN reached it

        await origin.stop()
        await go_pub(ghttp, b"go-2")
        await until(lambda: peer._service.adoption.adopted)
        assert peer._service.adoption.adopted[0][:3] == (1, 3, 0)
        peer_addr = f"127.0.0.1:{peer.tcp_port}"
        await until(lambda: len(got) == 6)
        assert sorted(got) == sorted([(b"go-1", f"127.0.0.1:{gtcp}"), (b"nsqtw-early", origin_addr),
                                      (b"go-2", f"127.0.0.1:{gtcp}"), (b"late-1", peer_addr),
                                      (b"late-2", peer_addr), (b"late-3", peer_addr)])
    finally:
        if consumer is not None:
            await consumer.stop()
        if origin._service.running:
            await origin.stop()
        await peer.stop()
