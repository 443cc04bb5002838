"""Channel policies (issue 46) on the sans-IO broker and a hand-moved clock: dead letters after
max_attempts, a maximum age, a bounded depth both ways, a delivery rate, a dead-letter topic, and
the policy values themselves."""

from __future__ import annotations

from typing import Any

import pytest

from nsqtw.nsqd.core.peek import peek_channel
from nsqtw.nsqd.core.policy import ChannelPolicy, PolicyError, TokenBucket

from nsqd_harness import Harness, cmd, mpub, pub, stats_of


def _policy(h: Harness, topic: str, channel: str, **settings: Any) -> None:
    h.broker.get_topic(topic, h.now).get_channel(channel, h.now)
    policy = ChannelPolicy().updated({k: str(v) for k, v in settings.items()}, topic=topic)
    h.broker.set_policy(topic, channel, policy, h.now)


def _dead(h: Harness, topic: str, channel: str) -> list[dict[str, Any]]:
    answer = peek_channel(h.channel(topic, channel), ("dead",), 100, 100, h.now)
    return answer["messages"]


def test_max_attempts_gives_each_message_exactly_that_many_deliveries_then_it_is_dead() -> None:
    h = Harness()
    _policy(h, "t", "c", max_attempts=3)
    h.publish("t", b"a", b"b")
    c = h.consumer("t", "c", rdy=10)
    seen: dict[bytes, list[int]] = {}
    for _ in range(10):
        msgs = c.messages()
        if not msgs:
            break
        for m in msgs:
            seen.setdefault(m.body, []).append(m.attempts)
            c.send(cmd("REQ", m.id.decode(), 0))
    assert seen == {b"a": [1, 2, 3], b"b": [1, 2, 3]}
    ch = h.channel("t", "c")
    assert ch.depth() == 0 and not ch.inflight and ch.requeue_count == 6
    dead = _dead(h, "t", "c")
    assert [(m["state"], m["attempts"], m["reason"]) for m in dead] == [("dead", 3, "max_attempts")] * 2
    assert all(m["died_at"] == int(h.now * 1e9) for m in dead)
    doc = stats_of(h, include_policies=True)["topics"][0]["channels"][0]
    assert doc["dead_count"] == 2 and doc["policy"]["max_attempts"] == 3
    # redrive: one more delivery each, with fresh attempts
    assert ch.redrive(None, h.now) == 2
    h.settle()
    again = c.messages()
    assert sorted((m.body, m.attempts) for m in again) == [(b"a", 1), (b"b", 1)]
    assert len(ch.dead) == 0


def test_timeouts_count_as_attempts_too() -> None:
    h = Harness(msg_timeout=1.0)
    _policy(h, "t", "c", max_attempts=2)
    h.publish("t", b"x")
    c = h.consumer("t", "c", rdy=1)
    assert [m.attempts for m in c.messages()] == [1]
    h.advance(1.5)
    h.scan()
    assert [m.attempts for m in c.messages()] == [2]
    h.advance(1.5)
    h.scan()
    c.nothing()
    assert [m["reason"] for m in _dead(h, "t", "c")] == ["max_attempts"]
    assert h.channel("t", "c").timeout_count == 2


def test_a_dead_message_leaves_other_channels_alone() -> None:
    h = Harness()
    _policy(h, "t", "strict", max_attempts=1)
    h.broker.get_topic("t").get_channel("lax", h.now)
    h.publish("t", b"x")
    strict = h.consumer("t", "strict", rdy=1)
    lax = h.consumer("t", "lax", rdy=1)
    for w in (strict, lax):
        (m,) = w.messages()
        w.send(cmd("REQ", m.id.decode(), 0))
    strict.nothing()
    assert [m.attempts for m in lax.messages()] == [2]
    assert len(h.channel("t", "strict").dead) == 1 and h.channel("t", "lax").dead is None


def test_max_age_drops_old_messages_without_dead_letters_and_keeps_them_with() -> None:
    h = Harness()
    _policy(h, "t", "drop", max_age="2s")
    _policy(h, "t", "keep", max_age="2s", max_attempts=5)
    h.publish("t", b"old")
    h.advance(3)
    h.publish("t", b"new")
    for name in ("drop", "keep"):
        c = h.consumer("t", name, rdy=10)
        assert [m.body for m in c.messages()] == [b"new"]
    drop, keep = h.channel("t", "drop"), h.channel("t", "keep")
    assert (drop.expired_count, drop.dropped_count, drop.dead) == (1, 1, None)
    assert (keep.expired_count, keep.dropped_count) == (1, 0)
    assert [(m["reason"], m["attempts"]) for m in _dead(h, "t", "keep")] == [("max_age", 0)]


def test_max_age_does_not_pull_back_what_is_in_flight() -> None:
    h = Harness()
    _policy(h, "t", "c", max_age="2s")
    h.publish("t", b"x")
    c = h.consumer("t", "c", rdy=1)
    (m,) = c.messages()
    h.advance(5)
    h.scan()
    c.send(cmd("FIN", m.id.decode()))
    assert c.frames() == [] and h.channel("t", "c").expired_count == 0


def test_max_depth_drop_oldest_keeps_the_newest() -> None:
    h = Harness()
    _policy(h, "t", "c", max_depth=5)
    _policy(h, "t", "dl", max_depth=5, overflow="drop-oldest", max_attempts=9)
    h.publish("t", *[b"m%d" % i for i in range(8)])
    ch = h.channel("t", "c")
    assert ch.depth() == 5 and ch.dropped_count == 3
    c = h.consumer("t", "c", rdy=10)
    assert [m.body for m in c.messages()] == [b"m%d" % i for i in range(3, 8)]
    dl = h.channel("t", "dl")
    assert dl.depth() == 5 and dl.dropped_count == 0
    assert [(m["body"], m["reason"]) for m in _dead(h, "t", "dl")] == [
        ("bTA=", "max_depth"), ("bTE=", "max_depth"), ("bTI=", "max_depth")]


def test_max_depth_refuse_fails_publishes_while_full() -> None:
    h = Harness()
    _policy(h, "t", "c", max_depth=5, overflow="refuse")
    p = h.producer()
    for i in range(5):
        p.send(pub("t", b"%d" % i))
        p.ok()
    p.send(pub("t", b"5"))
    assert p.error() == b"E_PUB_FAILED PUB failed channel t:c is at its max_depth of 5"
    p2 = h.producer()
    p2.send(mpub("t", [b"x", b"y"]))
    assert p2.error().startswith(b"E_MPUB_FAILED")
    assert h.channel("t", "c").depth() == 5
    c = h.consumer("t", "c", rdy=1)
    (m,) = c.messages()
    c.send(cmd("FIN", m.id.decode()))
    p3 = h.producer()
    p3.send(pub("t", b"again"))
    p3.ok()
    # the policy turned off: publishes go on
    h.broker.set_policy("t", "c", ChannelPolicy(), h.now)
    p3.send(pub("t", b"more"))
    p3.ok()


def test_max_rate_spreads_deliveries_over_time() -> None:
    h = Harness()
    _policy(h, "t", "c", max_rate=50)
    h.publish("t", *[b"%d" % i for i in range(1000)])
    c = h.consumer("t", "c", rdy=100)
    delivered = 0
    for _ in range(40):  # 4 s of queue scans, 100 ms apart
        msgs = c.messages()
        delivered += len(msgs)
        for m in msgs:
            c.send(cmd("FIN", m.id.decode()))
        h.advance(0.1)
        h.broker.wake_throttled()
        h.scan()
    delivered += len(c.messages())
    assert 180 <= delivered <= 220, delivered


def test_dead_letter_topic_gets_each_dead_body() -> None:
    h = Harness()
    _policy(h, "t", "c", max_attempts=1, dead_letter_topic="t_dead")
    h.broker.get_topic("t_dead").get_channel("ops", h.now)
    h.publish("t", b"poison")
    c = h.consumer("t", "c", rdy=1)
    (m,) = c.messages()
    c.send(cmd("REQ", m.id.decode(), 0))
    ops = h.consumer("t_dead", "ops", rdy=1)
    (d,) = ops.messages()
    assert d.body == b"poison" and d.attempts == 1 and d.id != m.id
    assert len(h.channel("t", "c").dead) == 1


def test_policy_values_and_errors() -> None:
    p = ChannelPolicy().updated({"max_attempts": "3", "max_age": "1m30s", "max_depth": "10",
                                 "overflow": "refuse", "max_rate": "2.5", "dead_letter_topic": "dl"}, topic="t")
    assert p.to_json() == {"max_attempts": 3, "max_age": "1m30s", "max_depth": 10, "overflow": "refuse",
                           "max_rate": 2.5, "dead_letter_topic": "dl"}
    assert ChannelPolicy.from_record(p.to_record()) == p
    off = p.updated({"max_age": "", "max_rate": ""})
    assert (off.max_age, off.max_rate, off.max_attempts) == (0.0, 0.0, 3)
    for name, value in (("max_attempts", "x"), ("max_attempts", "-1"), ("max_attempts", "70000"),
                        ("max_age", "soon"), ("max_age", "-5s"), ("max_depth", "1.5"),
                        ("overflow", "drop-newest"), ("max_rate", "fast"), ("dead_letter_topic", "bad name"),
                        ("dead_letter_topic", "t")):
        with pytest.raises(PolicyError) as e:
            ChannelPolicy().updated({name: value}, topic="t")
        assert e.value.code == "INVALID_" + name.upper()


def test_token_bucket_refills_at_its_rate_up_to_a_quarter_second() -> None:
    b = TokenBucket(40, 0.0)
    assert b.available(0.0) == 10
    b.spend(10)
    assert b.available(0.0) == 0 and b.due() == pytest.approx(0.025)
    assert b.available(0.1) == 4
    assert b.available(100.0) == 10


def test_no_policy_costs_nothing_on_the_channel() -> None:
    h = Harness()
    h.publish("t", b"x")
    h.broker.get_topic("t").get_channel("c", h.now)
    ch = h.channel("t", "c")
    assert ch.policy is None and ch.bucket is None and ch.dead is None and h.topic("t").bounded == ()
    assert "policy" not in stats_of(h)["topics"][0]["channels"][0]


def test_nsqd_wide_defaults_apply_to_new_channels() -> None:
    h = Harness(max_attempts=2, max_channel_depth=3, channel_overflow="refuse")
    h.broker.get_topic("t").get_channel("c", h.now)
    policy = h.channel("t", "c").policy
    assert policy is not None and (policy.max_attempts, policy.max_depth, policy.overflow) == (2, 3, "refuse")
