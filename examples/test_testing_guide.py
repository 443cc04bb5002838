"""
The testing guide's examples (docs/guide/testing.rst includes them from here), run as tests:
virtual time, recorded traffic, faults and replicated clusters.

Run it with ``pytest examples/test_testing_guide.py`` (the ``nsqtw_*`` fixtures come from
nsqtw's pytest plugin, loaded automatically once nsqtw is installed).
"""

import pytest
import pytest_twisted
from twisted.internet import defer

from nsqtw.client import Config, Consumer, Producer
from nsqtw.errors import PubFailed


@pytest_twisted.ensureDeferred
async def test_an_unfinished_order_is_delivered_again(nsqtw_clock, nsqtw_nsqd):
    seen = []
    arrived = defer.Deferred()

    def handler(msg):
        seen.append(msg)
        if msg.attempts == 1:
            msg.disable_auto_response()  # left unfinished: nsqd times it out
        else:
            arrived.callback(None)  # returning FINs it

    consumer = Consumer("orders", "billing", handler, Config(heartbeat_interval=60))
    await consumer.connect_to_nsqd(nsqtw_nsqd.tcp_address)
    await nsqtw_nsqd.publish("orders", b"order 1")
    await nsqtw_nsqd.wait_until(lambda: seen)
    nsqtw_clock.advance(61)  # past --msg-timeout: no waiting
    await arrived
    assert [m.attempts for m in seen] == [1, 2] and seen[0].id == seen[1].id
    seen[0].finish()  # the stale copy (nsqd says E_FIN_FAILED): the consumer need not wait for it
    await consumer.stop()


@pytest_twisted.ensureDeferred
async def test_a_reminder_goes_out_an_hour_later(nsqtw_clock, nsqtw_nsqd):
    reminder = nsqtw_nsqd.wait_for_messages("reminders", "sms", 1)
    await nsqtw_nsqd.deferred_publish("reminders", 3600, b"call back")
    await nsqtw_nsqd.advance(3600)  # an hour, in steps: connected clients stay connected
    [msg] = await reminder
    assert msg.body == b"call back"


@pytest_twisted.ensureDeferred
async def test_checkout_publishes_one_order_and_no_audit(nsqtw_nsqd):
    producer = Producer(nsqtw_nsqd.tcp_address)  # the code under test would do this
    await producer.publish("orders", b'{"id": 1}')
    await producer.stop()
    nsqtw_nsqd.assert_published("orders", body=b'{"id": 1}', count=1)
    nsqtw_nsqd.assert_nothing_published("audit")
    [order] = nsqtw_nsqd.published("orders")
    assert order.client is not None  # the publishing connection's client_id


@pytest_twisted.ensureDeferred
async def test_the_publisher_sees_a_refused_publish(nsqtw_nsqd):
    nsqtw_nsqd.faults.refuse_publishes(1)
    producer = Producer(nsqtw_nsqd.tcp_address)
    with pytest.raises(PubFailed):
        await producer.publish("orders", b"lost?")
    await producer.publish("orders", b"retried")  # the next one goes through
    await producer.stop()
    assert [p.body for p in nsqtw_nsqd.published("orders")] == [b"retried"]


@pytest_twisted.ensureDeferred
async def test_messages_survive_a_restart(nsqtw_nsqd):
    await nsqtw_nsqd.publish("orders", b"kept")
    await nsqtw_nsqd.faults.restart()  # same data directory, same ports
    [msg] = await nsqtw_nsqd.wait_for_messages("orders", "billing", 1)
    assert msg.body == b"kept"


@pytest.mark.nsqtw_cluster(nodes=[{"replicate_to": [1]}, {"adopt_after": 0.5}])
@pytest_twisted.ensureDeferred
async def test_the_replica_delivers_what_a_dead_origin_held(nsqtw_cluster):
    origin, replica = nsqtw_cluster.nsqds  # ready: the link is in sync
    await origin.publish("orders", b"order 1")
    await nsqtw_cluster.kill(0)
    [msg] = await replica.wait_for_messages("orders", "billing", 1, timeout=10)
    assert msg.body == b"order 1"
