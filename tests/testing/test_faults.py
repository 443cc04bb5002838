"""Fault injection on a live nsqd fixture: each fault through the path a real one takes."""

from __future__ import annotations

import pytest
import pytest_twisted
import treq

from nsqtw.client import Config, Consumer, Producer
from nsqtw.errors import PubFailed
from nsqtw.testing import body_command, connect_raw
from nsqtw.protocol.frames import FRAME_ERROR


@pytest_twisted.ensureDeferred
async def test_refuse_the_next_n_publishes_with_e_pub_failed(nsqtw_nsqd):
    nsqtw_nsqd.faults.refuse_publishes(2)
    s = await connect_raw(nsqtw_nsqd.tcp_port)
    try:
        s.send(body_command("PUB", "orders", body=b"1"))
        assert await s.frame() == (FRAME_ERROR, b"E_PUB_FAILED PUB failed refused by the test")
    finally:
        await s.close()
    r = await treq.post(f"{nsqtw_nsqd.http_url}/pub?topic=orders", b"2")
    assert r.code == 503
    await nsqtw_nsqd.publish("orders", b"3")  # the third goes through
    assert [p.body for p in nsqtw_nsqd.published("orders")] == [b"3"]
    assert nsqtw_nsqd.depth("orders") == 1


@pytest_twisted.ensureDeferred
async def test_drop_connections_closes_every_client_and_requeues_in_flight(nsqtw_nsqd):
    got = []

    def handle(msg):
        msg.disable_auto_response()
        got.append(msg)

    consumer = Consumer("t", "ch", handle, Config(max_in_flight=5))
    await consumer.connect_to_nsqd(nsqtw_nsqd.tcp_address)
    try:
        await nsqtw_nsqd.publish("t", b"x")
        await nsqtw_nsqd.wait_until(lambda: got)
        assert nsqtw_nsqd.faults.drop_connections() >= 2  # the consumer and the fixture's producer
        await nsqtw_nsqd.wait_until(lambda: not nsqtw_nsqd._broker.clients)
        assert nsqtw_nsqd.depth("t", "ch") == 1  # back in its channel
    finally:
        await consumer.stop()


@pytest_twisted.ensureDeferred
async def test_pause_deliveries_queues_until_resumed(nsqtw_nsqd):
    nsqtw_nsqd.faults.pause_deliveries()
    waiting = nsqtw_nsqd.wait_for_messages("t", "ch", 1)
    await nsqtw_nsqd.publish("t", b"held")
    await nsqtw_nsqd.wait_until(lambda: nsqtw_nsqd.depth("t", "ch") == 1)
    assert not waiting.called and nsqtw_nsqd.handled("delivered") == []
    nsqtw_nsqd.faults.resume_deliveries()
    [msg] = await waiting
    assert msg.body == b"held"


@pytest.mark.nsqtw_options(mem_queue_size=0)
@pytest_twisted.ensureDeferred
async def test_fill_disk_refuses_what_needs_the_disk_then_accepts_again(nsqtw_nsqd):
    await nsqtw_nsqd.publish("t", b"stored")
    nsqtw_nsqd.faults.fill_disk()
    producer = Producer(nsqtw_nsqd.tcp_address)
    try:
        with pytest.raises(PubFailed, match=r"^PUB failed DISKQUEUE\(t\) write failed - No space left on device$"):
            await producer.publish("t", b"refused")
        ping = await treq.get(f"{nsqtw_nsqd.http_url}/ping")
        assert ping.code == 500 and b"No space left on device" in await ping.content()
        nsqtw_nsqd.faults.free_disk()
        await producer.publish("t", b"accepted")
    finally:
        await producer.stop()
    got = await nsqtw_nsqd.wait_for_messages("t", "ch", 2)
    assert [m.body for m in got] == [b"stored", b"accepted"]


@pytest_twisted.ensureDeferred
async def test_restart_keeps_the_data_the_ports_and_the_record(nsqtw_nsqd):
    tcp, http, data = nsqtw_nsqd.tcp_address, nsqtw_nsqd.http_address, nsqtw_nsqd.data_path
    old = nsqtw_nsqd.handle
    await nsqtw_nsqd.publish("t", b"before")
    await nsqtw_nsqd.faults.restart()
    assert nsqtw_nsqd.handle is not old
    assert (nsqtw_nsqd.tcp_address, nsqtw_nsqd.http_address, nsqtw_nsqd.data_path) == (tcp, http, data)
    assert nsqtw_nsqd.depth("t") == 1  # read back from its data directory
    await nsqtw_nsqd.publish("t", b"after")
    got = await nsqtw_nsqd.wait_for_messages("t", "ch", 2)
    assert sorted(m.body for m in got) == [b"after", b"before"]  # memory first, then the disk queue
    assert [p.body for p in nsqtw_nsqd.published("t")] == [b"before", b"after"]
