"""Replication on a real full disk (a small tmpfs; needs root, skipped saying why otherwise):
a peer whose disk fills while it adopts keeps trying, says so in /ping and /stats, finishes
once space returns (nothing republished twice), and adopts the next origin as usual; a peer
that cannot store its origin's batches says so in its own /ping."""

from __future__ import annotations

import os

import pytest
import pytest_twisted
import treq

from fulldisk_support import fill
from nsqtw.embed import start_nsqd

from replication_support import count, data_dir, drain, publish, secret_file, until

pytestmark = pytest.mark.e2e


async def _ping(node) -> tuple[int, str]:
    r = await treq.get(f"http://127.0.0.1:{node.http_port}/ping")
    return r.code, (await r.text())


@pytest_twisted.ensureDeferred
async def test_adoption_on_a_full_disk_is_retried_until_space_returns_and_the_next_origin_is_adopted(
        small_tmpfs, tmp_path):
    secret = secret_file(tmp_path)
    peer = await start_nsqd(node_id=2, replication_address="127.0.0.1:0", data_path=small_tmpfs,
                            http_address="127.0.0.1:0", mem_queue_size=0, replication_secret_file=secret,
                            replication_timeout=1.0, adopt_after=1.0)
    origins = []
    try:
        first = await start_nsqd(node_id=1, replica_peers=[f"127.0.0.1:{peer._service.replication_port}"],
                                 replication_secret_file=secret, data_path=data_dir(tmp_path, "o1"))
        origins.append(first)
        await until(lambda: first._service.replication.origin.in_sync() == 1)
        acknowledged = await publish(first.tcp_port, "t", b"first", 50)
        await until(lambda: peer._service.shadow_files.states[1].count() == 50)
        filler = fill(small_tmpfs)
        await first.stop()
        # the adoption fails on the full disk; it is tried again, visibly, and never stops the loop
        await until(lambda: peer._service.adoption.failures.get(1, ("", 0, 0))[2] >= 2, 10)
        status = peer._service.replication_stats()["adoption"]
        assert status["failing"][0]["origin_node_id"] == 1 and "space" in status["failing"][0]["error"]
        code, text = await _ping(peer)
        assert code == 500 and "No space left on device" in text
        ok, text = peer._service.replication_health()
        assert not ok and "adopting node 1 failed" in text
        assert not peer._service.adoption.adopted
        os.unlink(filler)
        await until(lambda: peer._service.adoption.adopted, 10)
        assert peer._service.adoption.adopted[0][:2] == (1, 50) and not peer._service.adoption.failures
        # the next origin is adopted as usual
        second = await start_nsqd(node_id=3, replica_peers=[f"127.0.0.1:{peer._service.replication_port}"],
                                  replication_secret_file=secret, data_path=data_dir(tmp_path, "o3"))
        origins.append(second)
        await until(lambda: second._service.replication.origin.in_sync() == 1)
        acknowledged += await publish(second.tcp_port, "t", b"second", 10)
        await until(lambda: peer._service.shadow_files.states.get(3) is not None
                    and peer._service.shadow_files.states[3].count() == 10)
        await second.stop()
        await until(lambda: len(peer._service.adoption.adopted) == 2, 10)
        delivered = await drain(peer.tcp_port, "t", "c", set(acknowledged))
        assert count(acknowledged, delivered) == (0, 0) and len(acknowledged) == 60
    finally:
        for o in origins:
            if o._service.running:
                await o.stop()
        await peer.stop()


@pytest_twisted.ensureDeferred
async def test_a_peer_that_cannot_store_its_origins_batches_says_so_in_its_ping(small_tmpfs, tmp_path):
    secret = secret_file(tmp_path)
    peer = await start_nsqd(node_id=2, replication_address="127.0.0.1:0", data_path=small_tmpfs,
                            http_address="127.0.0.1:0", replication_secret_file=secret)
    origin = await start_nsqd(node_id=1, replica_peers=[f"127.0.0.1:{peer._service.replication_port}"],
                              replication_secret_file=secret, data_path=data_dir(tmp_path, "o1"))
    try:
        await until(lambda: origin._service.replication.origin.in_sync() == 1)
        assert (await _ping(peer))[0] == 200
        fill(small_tmpfs)
        # the peer's shadow log is pre-extended; a publish large enough needs a new window
        refused = await publish(origin.tcp_port, "t", b"x" * 65536, 300)
        code, text = await _ping(peer)
        assert code == 500 and "storing origins' batches failed" in text and "E_STORE_FAILED" in text
        assert len(refused) < 300  # the origin refused what the peer could not store
    finally:
        await origin.stop()
        await peer.stop()
