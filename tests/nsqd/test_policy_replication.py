"""Channel policies and dead letters on the replication link (issue 46 item 6), sans-IO: what a
replicated origin's broker tells its peers, the shadow a peer keeps (live items, its compacted
snapshot, and a catch-up snapshot of the origin), and an adoption that brings both back."""

from __future__ import annotations

from nsqd_harness import Harness, cmd

from nsqtw.nsqd.core.broker import Broker, Event
from nsqtw.nsqd.core.policy import ChannelPolicy
from nsqtw.nsqd.core.replication import ReplicatedBroker
from nsqtw.nsqd.core.replication.adoption import adopt
from nsqtw.nsqd.core.replication.broker import StoreHooks
from nsqtw.nsqd.core.replication.shadow import ShadowState, outstanding
from nsqtw.options import NsqdOptions
from nsqtw.protocol import replication as wire

T0 = 1_795_302_682.0


def _origin() -> tuple[ReplicatedBroker, list[wire.Entry]]:
    items: list[wire.Entry] = []
    hooks = StoreHooks(
        record=lambda topic, due, frames, n: items.append((wire.MSG, topic, "", due, frames)),
        fin=lambda topic, channel, mid: items.append((wire.FIN, topic, channel, 0, wire.fin_data([mid]))),
        req=lambda topic, channel, mid, due: items.append((wire.REQ, topic, channel, 0, wire.req_data([(mid, due)]))),
        policy=lambda topic, channel, record: items.append((wire.POLICY, topic, channel, 0, record)),
        dead=lambda topic, channel, frames, why: items.append((wire.DEAD, topic, channel, why, b"".join(frames))))
    b = ReplicatedBroker(NsqdOptions(replication_insecure=True, node_id=1, replica_peers=["127.0.0.1:9"]), T0,
                         hooks=hooks)

    def event(kind: str, topic: str, channel: str | None) -> None:
        if kind == Event.TOPIC_CREATED:
            items.append((wire.TOPIC_NEW, topic, "", 0, b""))
        elif kind == Event.CHANNEL_CREATED:
            items.append((wire.CHANNEL_NEW, topic, channel or "", 0, b""))

    b.listeners.append(event)
    return b, items


def _consume_and_req(b: Broker, topic: str, channel: str, times: int) -> None:
    """A stock consumer on ``topic/channel`` that REQs whatever it gets, ``times`` rounds."""
    h = Harness()
    h.broker = b
    h.now = T0
    c = h.consumer(topic, channel, rdy=100)
    for _ in range(times):
        for m in c.messages():
            c.send(cmd("REQ", m.id.decode(), 0))
    c.disconnect()


def _build() -> tuple[ReplicatedBroker, list[wire.Entry]]:
    b, items = _origin()
    b.get_topic("t", T0).get_channel("c", T0)
    b.get_topic("t").get_channel("other", T0)
    b.set_policy("t", "c", ChannelPolicy(max_attempts=2, max_depth=100), T0)
    b.publish("t", [b"poison", b"fine"], T0)
    _consume_and_req(b, "t", "c", 3)
    return b, items


def _check_adopted(state: ShadowState) -> None:
    adopter = Broker(NsqdOptions(node_id=2), T0)
    adopted, refused = adopt(adopter, state, T0)
    assert refused == 0
    ch = adopter.find_channel("t", "c")
    assert ch.policy == ChannelPolicy(max_attempts=2, max_depth=100)
    assert ch.dead is not None and sorted(letter.frame[34:] for letter in ch.dead) == [b"fine", b"poison"]
    assert {letter.reason for letter in ch.dead} == {"max_attempts"}
    assert ch.depth() == 0  # dead on c: not queued there again
    assert adopter.find_channel("t", "other").depth() == 2  # the other channel still owes both
    assert adopter.find_channel("t", "other").dead is None


def test_policy_and_dead_letters_travel_as_live_items_and_survive_adoption() -> None:
    b, items = _build()
    kinds = [k for k, *_ in items]
    assert wire.POLICY in kinds and kinds.count(wire.DEAD) == 2  # one per REQ that killed
    state = ShadowState()
    state.apply(items)
    assert list(state.policies) == [("t", "c")] and len(state.dead[("t", "c")]) == 2
    _check_adopted(state)


def test_the_shadows_compacted_snapshot_keeps_them() -> None:
    _, items = _build()
    state = ShadowState()
    state.apply(items)
    again = ShadowState()
    again.apply(state.snapshot())
    assert again.policies == state.policies and again.dead == state.dead
    _check_adopted(again)


def test_a_catch_up_snapshot_of_the_origin_carries_them() -> None:
    b, _ = _build()
    state = ShadowState()
    state.apply(list(outstanding(b, 1)))
    _check_adopted(state)


def test_emptied_dead_letters_and_a_policy_turned_off_reach_the_shadow() -> None:
    b, items = _build()
    ch = b.find_channel("t", "c")
    assert ch.empty_dead() == 2
    b.set_policy("t", "c", ChannelPolicy(), T0)
    state = ShadowState()
    state.apply(items)
    assert state.dead.get(("t", "c")) == {} and state.policies == {}
