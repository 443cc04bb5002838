"""
A test suite's view of nsqtw: a real nsqd in the test, no Go binary (``pip install "nsqtw[pytest]"``).

Run it with ``pytest examples/test_with_nsqtw.py`` (the ``nsqtw_*`` fixtures
come from nsqtw's pytest plugin, loaded automatically once nsqtw is installed;
from a checkout add ``-p nsqtw.testing.pytest_plugin``).
"""

import pytest
import pytest_twisted


@pytest_twisted.ensureDeferred
async def test_order_is_billed(nsqtw_nsqd):
    """What the application publishes reaches a consumer of the billing channel."""
    await nsqtw_nsqd.publish("orders", b'{"id": 1}')
    [msg] = await nsqtw_nsqd.wait_for_messages("orders", "billing", 1, timeout=5)
    assert msg.body == b'{"id": 1}'


@pytest.mark.nsqtw_cluster(nsqd=2)
@pytest_twisted.ensureDeferred
async def test_lookupd_sees_both_brokers(nsqtw_cluster):
    """Two nsqd registered with one nsqlookupd; a topic on one of them is discoverable."""
    await nsqtw_cluster.nsqds[0].publish("events", b"x")
    producers = await nsqtw_cluster.lookupd.wait_for_producers(1, topic="events")
    assert producers[0].peer.tcp_port == nsqtw_cluster.nsqds[0].tcp_port
