"""RegistrationDB: nsqlookupd's registration semantics, with time written as literal ``now``."""

from __future__ import annotations

from nsqtw.lookupd.core.peers import PeerInfo
from nsqtw.lookupd.core.registry import (
    CHANNEL, CLIENT, TOPIC, Producer, Registration, RegistrationDB, filter_by_active,
)


def peer(n: int = 1, now: float = 0.0) -> PeerInfo:
    return PeerInfo(id=f"10.0.0.{n}:5{n}000", remote_address=f"10.0.0.{n}:5{n}000",
                    hostname=f"host{n}", broadcast_address=f"nsqd{n}", tcp_port=4150,
                    http_port=4151, version="1.3.0", last_update=now)


def test_registration_wildcards_match_key_and_subkey() -> None:
    """``*`` matches any key or subkey, but never another category."""
    reg = Registration(CHANNEL, "t", "c")
    assert reg.is_match(CHANNEL, "t", "*")
    assert reg.is_match(CHANNEL, "*", "c")
    assert reg.is_match(CHANNEL, "*", "*")
    assert not reg.is_match(TOPIC, "*", "*")
    assert not reg.is_match(CHANNEL, "t", "other")
    assert str(reg) == "channel:t:c" and str(Registration(CLIENT)) == "client::"


def test_add_producer_is_idempotent_per_peer() -> None:
    """A peer is added once per key; the second add reports False."""
    db = RegistrationDB()
    p = peer()
    key = Registration(TOPIC, "t")
    assert db.add_producer(key, Producer(p)) is True
    assert db.add_producer(key, Producer(p)) is False
    assert [x.peer for x in db.find_producers(TOPIC, "t", "")] == [p]


def test_remove_producer_keeps_the_key() -> None:
    """Removing the last producer leaves the registration with an empty list."""
    db = RegistrationDB()
    p = peer()
    key = Registration(TOPIC, "t")
    db.add_producer(key, Producer(p))
    assert db.remove_producer(key, p.id) == (True, 0)
    assert db.remove_producer(key, p.id) == (False, 0)
    assert key in db and db.find_producers(TOPIC, "t", "") == []
    assert db.remove_producer(Registration(TOPIC, "missing"), p.id) == (False, 0)


def test_find_producers_with_wildcard_lists_each_peer_once() -> None:
    """A peer on two channels of a topic appears once in a wildcard search."""
    db = RegistrationDB()
    p1, p2 = peer(1), peer(2)
    db.register(p1, "t", "a")
    db.register(p1, "t", "b")
    db.register(p2, "t", "b")
    found = db.find_producers(CHANNEL, "t", "*")
    assert sorted(x.peer.id for x in found) == sorted([p1.id, p2.id])
    assert sorted(r.subkey for r in db.find_registrations(CHANNEL, "t", "*")) == ["a", "b"]
    assert db.find_registrations(CHANNEL, "t", "zzz") == []


def test_register_with_channel_adds_channel_and_topic() -> None:
    """REGISTER t c puts the peer under channel:t:c and topic:t:."""
    db = RegistrationDB()
    p = peer()
    added = db.register(p, "t", "c")
    assert added == [Registration(CHANNEL, "t", "c"), Registration(TOPIC, "t")]
    assert db.topics() == ["t"] and db.channels("t") == ["c"]
    assert db.register(p, "t", "c") == []


def test_register_without_channel_adds_topic_only() -> None:
    """REGISTER t creates no channel registration."""
    db = RegistrationDB()
    db.register(peer(), "t")
    assert db.topics() == ["t"] and db.channels("t") == []


def test_unregister_channel_leaves_an_empty_non_ephemeral_channel() -> None:
    """UNREGISTER t c keeps the non-ephemeral channel key (so /channels still lists it)."""
    db = RegistrationDB()
    p = peer()
    db.register(p, "t", "c")
    assert db.unregister(p, "t", "c") == [Registration(CHANNEL, "t", "c")]
    assert db.channels("t") == ["c"]
    assert db.find_producers(CHANNEL, "t", "c") == []
    assert [x.peer for x in db.find_producers(TOPIC, "t", "")] == [p]


def test_unregister_ephemeral_channel_removes_it_when_no_producer_is_left() -> None:
    """An #ephemeral channel goes with its last producer, not before."""
    db = RegistrationDB()
    p1, p2 = peer(1), peer(2)
    db.register(p1, "t", "c#ephemeral")
    db.register(p2, "t", "c#ephemeral")
    db.unregister(p1, "t", "c#ephemeral")
    assert db.channels("t") == ["c#ephemeral"]
    db.unregister(p2, "t", "c#ephemeral")
    assert db.channels("t") == []


def test_unregister_topic_leaves_every_channel_then_the_topic() -> None:
    """UNREGISTER t removes the peer from all of t's channels and from t; keys stay."""
    db = RegistrationDB()
    p1, p2 = peer(1), peer(2)
    db.register(p1, "t", "a")
    db.register(p1, "t", "b")
    db.register(p2, "t", "a")
    removed = db.unregister(p1, "t")
    assert set(removed) == {Registration(CHANNEL, "t", "a"), Registration(CHANNEL, "t", "b"),
                            Registration(TOPIC, "t")}
    assert db.topics() == ["t"] and sorted(db.channels("t")) == ["a", "b"]
    assert [x.peer for x in db.find_producers(CHANNEL, "t", "*")] == [p2]
    assert [x.peer for x in db.find_producers(TOPIC, "t", "")] == [p2]


def test_unregister_ephemeral_topic_removes_it_when_no_producer_is_left() -> None:
    """An #ephemeral topic key is deleted by the last producer's UNREGISTER."""
    db = RegistrationDB()
    p = peer()
    db.register(p, "t#ephemeral")
    db.unregister(p, "t#ephemeral")
    assert db.topics() == []


def test_unregister_topic_keeps_non_ephemeral_topic() -> None:
    """A non-ephemeral topic stays (with no producers) after UNREGISTER t."""
    db = RegistrationDB()
    p = peer()
    db.register(p, "t")
    db.unregister(p, "t")
    assert db.topics() == ["t"] and db.has_topic("t")


def test_remove_peer_drops_every_registration_but_keeps_keys() -> None:
    """A closed connection removes the peer from client, topics and channels; keys remain."""
    db = RegistrationDB()
    p1, p2 = peer(1), peer(2)
    db.identify(p1)
    db.identify(p2)
    db.register(p1, "t", "c")
    removed = db.remove_peer(p1.id)
    assert set(removed) == {Registration(CLIENT), Registration(TOPIC, "t"), Registration(CHANNEL, "t", "c")}
    assert db.lookup_registrations(p1.id) == []
    assert db.topics() == ["t"] and db.channels("t") == ["c"]
    assert [x.peer for x in db.find_producers(CLIENT, "", "")] == [p2]


def test_filter_by_active_drops_inactive_and_tombstoned() -> None:
    """Producers silent longer than the timeout, or tombstoned within the lifetime, are filtered."""
    fresh, stale, tomb = Producer(peer(1, now=100.0)), Producer(peer(2, now=10.0)), Producer(peer(3, now=100.0))
    tomb.tombstone(now=90.0)
    kept = filter_by_active([fresh, stale, tomb], inactive_timeout=60.0, tombstone_lifetime=45.0, now=100.0)
    assert kept == [fresh]
    # the tombstone expires after its lifetime; exactly at the timeout a producer still counts
    kept = filter_by_active([fresh, stale, tomb], inactive_timeout=90.0, tombstone_lifetime=45.0, now=135.0)
    assert kept == [fresh, tomb]
    assert filter_by_active([stale], inactive_timeout=90.0, tombstone_lifetime=0.0, now=100.0) == [stale]


def test_tombstone_lifetime_zero_never_hides() -> None:
    """is_tombstoned with a lifetime of 0 is False (how /nodes keeps tombstoned nodes)."""
    p = Producer(peer())
    p.tombstone(now=5.0)
    assert p.tombstoned and not p.is_tombstoned(0.0, now=5.0)
    assert p.is_tombstoned(1.0, now=5.5) and not p.is_tombstoned(1.0, now=6.0)


def test_topic_producers_apply_both_filters() -> None:
    """/lookup's producer list: active and not tombstoned."""
    db = RegistrationDB()
    p1, p2 = peer(1, now=0.0), peer(2, now=0.0)
    db.register(p1, "t")
    db.register(p2, "t")
    assert db.tombstone_topic_producer("t", "nsqd2:4151", now=10.0) == 1
    assert db.topic_producers("t", 300.0, 45.0, now=20.0) == [p1]
    assert db.topic_producers("t", 300.0, 45.0, now=60.0) == [p1, p2]
    assert db.topic_producers("t", 30.0, 45.0, now=60.0) == []


def test_tombstone_matches_broadcast_address_and_http_port_only() -> None:
    """A node that matches no producer tombstones nothing and is not an error."""
    db = RegistrationDB()
    db.register(peer(1), "t")
    assert db.tombstone_topic_producer("t", "nsqd1:4150", now=1.0) == 0
    assert db.tombstone_topic_producer("other", "nsqd1:4151", now=1.0) == 0
    assert db.tombstone_topic_producer("t", "nsqd1:4151", now=1.0) == 1


def test_tombstone_only_affects_the_topic_registration() -> None:
    """The producer under the channel key keeps its own, untombstoned state."""
    db = RegistrationDB()
    p = peer(1)
    db.register(p, "t", "c")
    db.tombstone_topic_producer("t", "nsqd1:4151", now=1.0)
    assert db.find_producers(TOPIC, "t", "")[0].tombstoned
    assert not db.find_producers(CHANNEL, "t", "c")[0].tombstoned


def test_create_and_delete_topic_and_channel() -> None:
    """HTTP-side create/delete: channel create adds the topic; topic delete drops its channels."""
    db = RegistrationDB()
    db.create_channel("t", "c")
    assert db.topics() == ["t"] and db.channels("t") == ["c"]
    db.create_topic("u")
    assert db.topics() == ["t", "u"]
    assert db.delete_channel("t", "c") is True
    assert db.delete_channel("t", "c") is False
    db.create_channel("t", "d")
    db.register(peer(), "t", "e")
    db.delete_topic("t")
    assert db.topics() == ["u"] and db.channels("t") == []
    db.delete_topic("never")  # no error, as nsqlookupd


def test_nodes_lists_topics_with_tombstones_and_ignores_the_tombstone_lifetime() -> None:
    """/nodes: active clients with their topics; tombstoned topics flagged, nodes kept."""
    db = RegistrationDB()
    p1, p2 = peer(1, now=0.0), peer(2, now=0.0)
    for p in (p1, p2):
        db.identify(p)
    db.register(p1, "a", "c")
    db.register(p1, "b")
    db.register(p2, "b")
    db.tombstone_topic_producer("b", "nsqd1:4151", now=5.0)
    nodes = {info.id: (topics, tombs) for info, topics, tombs in db.nodes(300.0, 45.0, now=10.0)}
    assert nodes[p1.id] == (["a", "b"], [False, True])
    assert nodes[p2.id] == (["b"], [False])
    assert db.nodes(300.0, 45.0, now=100.0)[0][2] == [False, False]
    p2.last_update = 100.0
    assert [info.id for info, _, _ in db.nodes(50.0, 45.0, now=100.0)] == [p2.id]


def test_indexes_agree_with_a_full_scan() -> None:
    """After a random mix of operations every lookup equals a brute-force scan of the map."""
    import random

    rng = random.Random(5)
    db = RegistrationDB()
    peers = [peer(n) for n in range(1, 5)]
    topics, channels = ["a", "b", "c#ephemeral"], ["x", "y#ephemeral", ""]
    for _ in range(500):
        p, t, c = rng.choice(peers), rng.choice(topics), rng.choice(channels)
        op = rng.randrange(7)
        if op < 3:
            db.register(p, t, c)
        elif op == 3:
            db.unregister(p, t, c)
        elif op == 4:
            db.remove_peer(p.id)
        elif op == 5:
            db.delete_topic(t) if rng.random() < 0.3 else db.delete_channel(t, c or "x")
        else:
            db.identify(p)
        everything = list(db._map)
        for cat in (CLIENT, TOPIC, CHANNEL):
            for key in ["*", ""] + topics:
                for sub in ["*", ""] + channels[:2]:
                    expect = [k for k in everything if k.is_match(cat, key, sub)]
                    assert db.find_registrations(cat, key, sub) == expect
        for q in peers:
            assert set(db.lookup_registrations(q.id)) == {k for k, ps in db._map.items() if q.id in ps}
