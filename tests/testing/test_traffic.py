"""The nsqd fixture records its traffic: publishes (topic, body, time, client) and what channels
did with them, with assertions that print what was there."""

from __future__ import annotations

import pytest
import pytest_twisted
import treq

from nsqtw.client import Config, Producer
from nsqtw.testing.clock import VIRTUAL_EPOCH


@pytest_twisted.ensureDeferred
async def test_publishes_are_recorded_with_topic_body_time_and_client(nsqtw_clock, nsqtw_nsqd):
    producer = Producer(nsqtw_nsqd.tcp_address, Config(client_id="checkout"))
    try:
        await producer.publish("orders", b"one")
        await producer.multi_publish("orders", [b"two", b"three"])
        await producer.deferred_publish("orders", 5, b"later")
    finally:
        await producer.stop()
    r = await treq.post(f"{nsqtw_nsqd.http_url}/pub?topic=audit", b"by http")
    assert r.code == 200
    got = nsqtw_nsqd.published("orders")
    assert [(p.body, p.delay) for p in got] == [(b"one", 0), (b"two", 0), (b"three", 0), (b"later", 5)]
    assert {p.client for p in got} == {"checkout"} and {p.time for p in got} == {VIRTUAL_EPOCH}
    [http] = nsqtw_nsqd.published("audit")
    assert http.body == b"by http" and http.client is None


@pytest_twisted.ensureDeferred
async def test_delivered_and_finished_are_recorded_per_channel(nsqtw_nsqd):
    await nsqtw_nsqd.multi_publish("t", [b"a", b"b"])
    await nsqtw_nsqd.wait_for_messages("t", "ch", 2)
    await nsqtw_nsqd.wait_until(lambda: len(nsqtw_nsqd.handled("finished")) == 2)
    assert [(h.kind, h.body, h.attempts) for h in nsqtw_nsqd.handled(channel="ch")] == [
        ("delivered", b"a", 1), ("delivered", b"b", 1), ("finished", b"a", 1), ("finished", b"b", 1)]


@pytest_twisted.ensureDeferred
async def test_assert_published_passes_and_fails_with_what_was_there(nsqtw_nsqd):
    await nsqtw_nsqd.publish("orders", b'{"id": 1}')
    await nsqtw_nsqd.publish("audit", "seen")
    nsqtw_nsqd.assert_published("orders")
    nsqtw_nsqd.assert_published("orders", body=b'{"id": 1}', count=1)
    nsqtw_nsqd.assert_published("audit", body="seen")
    nsqtw_nsqd.assert_nothing_published("billing")
    with pytest.raises(AssertionError) as e:
        nsqtw_nsqd.assert_published("orders", body=b'{"id": 2}')
    text = str(e.value)
    assert "expected a message on 'orders' with body b'{\"id\": 2}'; got 0" in text
    assert "1. t=" in text and "b'{\"id\": 1}' by " in text and "other topics: audit (1)" in text
    assert "- b'{\"id\": 2}'" in text and "+ b'{\"id\": 1}'" in text  # the diff against the closest
    with pytest.raises(AssertionError, match=r"expected 2 message\(s\) on 'orders'"):
        nsqtw_nsqd.assert_published("orders", count=2)
    with pytest.raises(AssertionError, match=r"expected nothing published on 'audit'\npublished on 'audit' \(1\)"):
        nsqtw_nsqd.assert_nothing_published("audit")


@pytest_twisted.ensureDeferred
async def test_reset_empties_every_topic_and_channel_and_forgets(nsqtw_nsqd):
    await nsqtw_nsqd.publish("a", b"1")
    for path in ("topic/create?topic=b", "channel/create?topic=b&channel=ch"):
        assert (await treq.post(f"{nsqtw_nsqd.http_url}/{path}")).code == 200
    await nsqtw_nsqd.publish("b", b"2")
    await nsqtw_nsqd.deferred_publish("b", 60, b"3")
    assert nsqtw_nsqd.depth("a") == 1 and nsqtw_nsqd.depth("b", "ch") == 1
    nsqtw_nsqd.reset()
    assert nsqtw_nsqd.depth("a") == 0 and nsqtw_nsqd.depth("b", "ch") == 0
    assert not nsqtw_nsqd._broker.topics["b"].channels["ch"].deferred
    nsqtw_nsqd.assert_nothing_published("a")
    await nsqtw_nsqd.publish("a", b"after")
    assert [m.body for m in await nsqtw_nsqd.wait_for_messages("a", "c", 1)] == [b"after"]
