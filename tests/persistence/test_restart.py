"""Clean shutdown and restart: nothing acknowledged is lost, deferred messages keep their delay,
a data directory written by Go's nsqd 1.3.0 opens with the depths nsqd reports."""

from __future__ import annotations

import shutil

import pytest
import pytest_twisted
from twisted.internet import reactor

from nsqtw.embed import start_nsqd
from nsqtw.testing import body_command, command, connect_raw, mpub_command


async def _drain(port: int, topic: str, channel: str, count: int, rdy: int = 100):
    client = await connect_raw(port)
    client.send(command("SUB", topic, channel) + command("RDY", rdy))
    assert await client.response() == b"OK"
    got = []
    for _ in range(count):
        msg = await client.message()
        got.append(msg)
        client.send(command("FIN", msg.id.decode()))
    await client.close()
    return got


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_memory_inflight_and_deferred_survive_a_clean_restart(tmp_path):
    """Messages in memory, in flight and deferred at stop are all delivered after a restart."""
    data = str(tmp_path)
    nsqd = await start_nsqd(data_path=data)
    pub = await connect_raw(nsqd.tcp_port)
    pub.send(mpub_command("orders", [b"m%d" % i for i in range(10)]))
    assert await pub.response() == b"OK"
    pub.send(body_command("DPUB", "orders", 3_600_000, body=b"later"))
    assert await pub.response() == b"OK"
    consumer = await connect_raw(nsqd.tcp_port)
    consumer.send(command("SUB", "orders", "billing") + command("RDY", 3))
    assert await consumer.response() == b"OK"
    inflight = [await consumer.message() for _ in range(3)]
    ch = nsqd._broker.find_channel("orders", "billing")
    assert len(ch.inflight) == 3 and ch.depth() == 7 and len(ch.deferred) == 1
    await pub.close()
    await nsqd.stop()

    again = await start_nsqd(data_path=data)
    try:
        ch = again._broker.find_channel("orders", "billing")
        # 7 queued + 3 that were in flight + the deferred one, which is an ordinary record on disk
        # (so Go's nsqd could read it too) until nsqtw's reader reaches it and holds it again
        assert ch.depth() == 11
        got = await _drain(again.tcp_port, "orders", "billing", 10)
        bodies = sorted(m.body for m in got)
        assert bodies == sorted(b"m%d" % i for i in range(10))
        redelivered = {m.body: m.attempts for m in got}
        for m in inflight:
            assert redelivered[m.body] == 2  # delivered once before the restart
        # the deferred message kept its delay: read back from disk, it waits again
        assert len(ch.deferred) == 1 and ch.deferred[0][0] > reactor.seconds() + 3000
    finally:
        await again.stop()


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_second_broker_on_same_data_path_is_refused(tmp_path):
    """The data path is locked: a second broker refuses to start with a clear message."""
    nsqd = await start_nsqd(data_path=str(tmp_path))
    try:
        with pytest.raises(Exception) as info:
            await start_nsqd(data_path=str(tmp_path))
        assert "possibly in use by another instance of nsqd" in str(info.value)
    finally:
        await nsqd.stop()


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_go_nsqd_data_directory_opens_with_nsqd_depths(tmp_path, fixtures_dir):
    """The fixture written by Go's nsqd 1.3.0 loads: depths, pause flags, no ephemeral topic."""
    data = tmp_path / "data"
    shutil.copytree(fixtures_dir / "go-nsqd-1.3.0-datadir" / "data", data)
    for f in data.iterdir():
        f.chmod(0o644)
    nsqd = await start_nsqd(data_path=str(data))
    try:
        b = nsqd._broker
        assert b.find_channel("orders", "billing").depth() == 91
        shipping = b.find_channel("orders", "shipping")
        assert shipping.depth() == 101 and shipping.paused
        assert b.find_topic("audit").depth() == 5
        assert b.find_topic("metrics").depth() == 3 and b.find_topic("metrics").paused
        assert "scratch#ephemeral" not in b.topics
        got = await _drain(nsqd.tcp_port, "orders", "billing", 91, rdy=91)
        bodies = [m.body for m in got]
        assert b"order-10" in bodies and b"later-0" in bodies and b"order-05" not in bodies
        attempts = {m.body: m.attempts for m in got}
        assert attempts[b"order-10"] == 2 and attempts[b"order-50"] == 1
    finally:
        await nsqd.stop()


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_a_stop_costs_what_must_be_written(tmp_path):
    """2,000 idle topics with a channel each and one busy one: the stop writes the busy queues
    and nsqd.dat, not 4,000 metadata files (issue 24: 10,000 topics took 46 s to stop;
    ``bench/bench_stop.py`` prints that time)."""
    data = str(tmp_path)
    nsqd = await start_nsqd(data_path=data, mem_queue_size=10)
    broker = nsqd._broker
    for i in range(2000):
        broker.get_topic(f"idle{i:04d}").get_channel("c", 0.0)
    pub = await connect_raw(nsqd.tcp_port)
    pub.send(mpub_command("busy", [b"m%d" % i for i in range(50)]))  # 40 past memory: on disk
    assert await pub.response() == b"OK"
    await pub.close()
    worker = nsqd._service.sync_worker
    before = worker.jobs
    await nsqd.stop()
    assert worker.jobs - before < 20, worker.jobs - before
    metas = sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".meta.dat"))
    assert metas == ["busy.diskqueue.meta.dat"]
    again = await start_nsqd(data_path=data)
    try:
        assert len(again._broker.topics) == 2001 and again._broker.topics["busy"].depth() == 50
    finally:
        await again.stop()
