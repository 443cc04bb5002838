"""etcd's part with ``task.Clock`` and an in-memory gateway (tests/etcd_fake.py): node ids
claimed under a lease, the lease kept and lost, adoption decided by who holds the origin's
adoption key, states recorded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from twisted.internet import task

from nsqtw.nsqd.core.replication.adoption import ADOPT, FORGET, STAND_BY, WAIT, PeerRule
from nsqtw.nsqd.etcd import NODE_FILE, EtcdError, EtcdSession, KeyValue, lease_ttl, prefix_end
from nsqtw.options import AUTO_NODE_ID, AutoNodeId, NsqdOptions, OptionError, options_from_strings
from nsqtw.protocol import replication as wire

from etcd_fake import FakeGateway

ETCD = ["http://127.0.0.1:2379"]


def _session(tmp_path: Path, name: str, gateway: FakeGateway, clock: task.Clock, timeout: float = 3.0) -> EtcdSession:
    path = tmp_path / name
    path.mkdir(exist_ok=True)
    options = NsqdOptions(node_id=AUTO_NODE_ID, etcd_endpoints=ETCD, replication_timeout=timeout,
                          data_path=str(path))
    return EtcdSession(options, clock, str(path), gateway=gateway)


def _claimed(session: EtcdSession, requested: int | None = None) -> Any:
    out: list[Any] = []
    session.claim(requested).addBoth(out.append)
    return out


def test_flags_parse_auto_and_the_endpoint_list() -> None:
    options = options_from_strings(NsqdOptions, {"node-id": "auto", "etcd-endpoints": "127.0.0.1:2379,https://e2:2379/"})
    assert isinstance(options.node_id, AutoNodeId) and f"{options.node_id}" == "auto"
    assert options.etcd_urls == ["http://127.0.0.1:2379", "https://e2:2379"]
    with pytest.raises(OptionError, match="--node-id=auto needs --etcd-endpoints"):
        options_from_strings(NsqdOptions, {"node-id": "auto"})
    with pytest.raises(OptionError, match="not an http"):
        options_from_strings(NsqdOptions, {"node-id": "1", "etcd-endpoints": "ftp://x"})
    # replication accepts an id claimed in etcd (it refuses the host name's hash)
    NsqdOptions(node_id=AUTO_NODE_ID, etcd_endpoints=ETCD, replication_address="127.0.0.1:0",
                replication_insecure=True)


def test_lease_ttl_follows_the_replication_timeout() -> None:
    assert lease_ttl(5.0) == 5 and lease_ttl(0.5) == 2 and lease_ttl(2.2) == 3
    assert prefix_end(b"/nsqtw/ids/") == b"/nsqtw/ids0" and prefix_end(b"a\xff") == b"b"


def test_five_auto_nodes_get_five_ids_and_a_data_path_keeps_its_own(tmp_path: Path) -> None:
    gateway, clock = FakeGateway(), task.Clock()
    sessions = [_session(tmp_path, f"n{i}", gateway, clock) for i in range(5)]
    ids = [_claimed(s)[0] for s in sessions]
    assert sorted(ids) == [1, 2, 3, 4, 5]
    assert gateway.held(b"/nsqtw/ids/3") is not None
    # node 3's data path comes back (after a clean stop): it takes 3 again, not the lowest free
    third = sessions[2]
    d = third.stopService() if third.running else None
    gateway.expire(third.lease)
    gateway.expire(sessions[0].lease)  # 1 is free too
    assert d is None
    again = _session(tmp_path, "n2", gateway, clock)
    assert json.loads((tmp_path / "n2" / NODE_FILE).read_text())["node_id"] == 3
    assert _claimed(again) == [3]


def test_an_id_raced_for_is_taken_by_one_and_the_other_takes_the_next(tmp_path: Path) -> None:
    gateway, clock = FakeGateway(), task.Clock()
    gateway.race[b"/nsqtw/ids/1"] = b'{"node_key": "someone else"}'
    assert _claimed(_session(tmp_path, "a", gateway, clock)) == [2]


def test_an_explicit_id_held_by_another_live_node_is_refused(tmp_path: Path) -> None:
    gateway, clock = FakeGateway(), task.Clock()
    assert _claimed(_session(tmp_path, "a", gateway, clock), 7) == [7]
    out = _claimed(_session(tmp_path, "b", gateway, clock), 7)
    assert out[0].check(EtcdError) and "--node-id 7 is held by another live node" in out[0].getErrorMessage()


def test_an_id_held_by_this_data_paths_crashed_run_is_waited_for(tmp_path: Path) -> None:
    gateway, clock = FakeGateway(), task.Clock()
    first = _session(tmp_path, "a", gateway, clock)
    assert _claimed(first, 4) == [4]
    old_lease = first.lease
    restarted = _session(tmp_path, "a", gateway, clock)  # same data path: same node key
    out = _claimed(restarted, 4)
    assert out == []  # waiting for the old lease to expire
    clock.advance(1.0)
    assert out == []
    gateway.expire(old_lease)
    clock.advance(1.0)
    assert out == [4] and restarted.lease != old_lease


def test_etcd_unreachable_at_start_fails_the_claim_after_the_start_timeout(tmp_path: Path) -> None:
    gateway, clock = FakeGateway(), task.Clock()
    gateway.down = True
    out = _claimed(_session(tmp_path, "a", gateway, clock))
    clock.pump([1.0] * 29)
    assert out == []
    clock.pump([1.0] * 3)
    assert out[0].check(EtcdError) and "no etcd endpoint answered" in out[0].getErrorMessage()


def test_a_lost_lease_stops_the_claim_and_the_same_id_is_held_again_when_free(tmp_path: Path) -> None:
    gateway, clock = FakeGateway(), task.Clock()
    s = _session(tmp_path, "a", gateway, clock)
    assert _claimed(s, None) == [1]
    s.startService()
    clock.advance(1.0)
    assert s.health() == (True, "OK") and s.alive(clock.seconds())
    gateway.expire(s.lease)  # revoked by someone, or expired while this node was frozen
    clock.advance(1.0)
    ok, text = s.health()
    assert not ok and "node id 1 is no longer held in etcd" in text and "expired" in text
    assert not s.alive(clock.seconds())
    clock.advance(1.0)  # the next renewal claims it again under a new lease
    assert s.health() == (True, "OK") and gateway.kv[b"/nsqtw/ids/1"].lease == s.lease
    s.stopService()
    assert b"/nsqtw/ids/1" not in gateway.kv  # revoked at the stop: free for the next run


def test_a_lost_id_taken_by_another_node_stays_unclaimed(tmp_path: Path) -> None:
    gateway, clock = FakeGateway(), task.Clock()
    s = _session(tmp_path, "a", gateway, clock)
    assert _claimed(s, None) == [1]
    s.startService()
    gateway.expire(s.lease)
    gateway.kv[b"/nsqtw/ids/1"] = KeyValue(b"/nsqtw/ids/1", b'{"node_key": "other", "broadcast_address": "h2"}', 555, 9)
    clock.pump([1.0] * 5)
    ok, text = s.health()
    assert not ok and "held by another node" in text and "'h2'" in text
    assert gateway.kv[b"/nsqtw/ids/1"].lease == 555  # never taken back from its holder
    s.stopService()


def test_etcd_unreachable_for_the_lease_ttl_loses_the_claim(tmp_path: Path) -> None:
    gateway, clock = FakeGateway(), task.Clock()
    s = _session(tmp_path, "a", gateway, clock)
    _claimed(s)
    s.startService()
    gateway.down = True
    clock.advance(1.0)
    assert s.health()[0] and not s.alive(clock.seconds() + 1.0)  # not for adoption already
    clock.pump([1.0] * 3)
    assert not s.health()[0] and "unreachable" in s.health()[1]
    s.stopService()


def test_record_state_writes_every_kind_in_one_document(tmp_path: Path) -> None:
    gateway, clock = FakeGateway(), task.Clock()
    s = _session(tmp_path, "a", gateway, clock)
    _claimed(s, 6)
    s.record_state("drain", {"started": 12.5})
    s.record_state("maintenance", {"until": 99.0})
    doc = json.loads(gateway.held(b"/nsqtw/nodes/6/state") or b"")
    assert doc == {"node_id": 6, "states": {"drain": {"started": 12.5}, "maintenance": {"until": 99.0}}}
    s.record_state("drain", None)
    got: list[Any] = []
    s.read_state(6).addCallback(got.append)
    assert got == [{"maintenance": {"until": 99.0}}]
    gateway.down = True
    failed: list[Any] = []
    s.record_state("drain", True).addErrback(failed.append)
    assert failed and failed[0].check(EtcdError)


# --- the arbiter -----------------------------------------------------------------------


def _two_survivors(tmp_path: Path) -> tuple[FakeGateway, task.Clock, EtcdSession, EtcdSession]:
    gateway, clock = FakeGateway(), task.Clock()
    two, three = _session(tmp_path, "two", gateway, clock), _session(tmp_path, "three", gateway, clock)
    assert _claimed(two, 2) == [2] and _claimed(three, 3) == [3]
    return gateway, clock, two, three


def test_of_two_survivors_who_cannot_see_each_other_one_adopts(tmp_path: Path) -> None:
    gateway, clock, two, three = _two_survivors(tmp_path)
    a2, a3 = two.arbiter(), three.arbiter()
    # neither sees the other (no holders): the peers' rule would let both adopt
    assert PeerRule(2).decide(1, 77, [], 0.0) == (ADOPT, None) == PeerRule(3).decide(1, 77, [], 0.0)
    assert a3.decide(1, 77, [], clock.seconds()) == (WAIT, None)  # asked etcd: node 3 got there first
    assert a2.decide(1, 77, [], clock.seconds()) == (WAIT, None)
    assert a3.decide(1, 77, [], clock.seconds()) == (ADOPT, None)
    assert a2.decide(1, 77, [], clock.seconds()) == (STAND_BY, 3)
    assert a2.status()[0]["peer_node_id"] == 3
    # node 3 finishes: node 2 drops its shadow
    a3.adopted(1, 77)
    assert gateway.held(b"/nsqtw/adopted/1/77") == b"3"
    clock.advance(1.0)
    a2.decide(1, 77, [], clock.seconds())
    assert a2.decide(1, 77, [], clock.seconds()) == (FORGET, 3)
    # another epoch is another question
    assert a2.decide(1, 78, [], clock.seconds()) == (WAIT, None)
    assert a2.decide(1, 78, [], clock.seconds()) == (ADOPT, None)


def test_a_holder_that_dies_before_it_finishes_lets_another_adopt(tmp_path: Path) -> None:
    gateway, clock, two, three = _two_survivors(tmp_path)
    a2, a3 = two.arbiter(), three.arbiter()
    a2.decide(1, 5, [], clock.seconds())
    a3.decide(1, 5, [], clock.seconds())
    assert a3.decide(1, 5, [], clock.seconds()) == (STAND_BY, 2)
    gateway.expire(two.lease)  # node 2 is lost: its lease expires, its key with it
    clock.advance(0.5)
    assert a3.decide(1, 5, [], clock.seconds()) == (STAND_BY, 2)  # not asked again yet
    clock.advance(0.6)
    a3.decide(1, 5, [], clock.seconds())
    assert a3.decide(1, 5, [], clock.seconds()) == (ADOPT, None)


def test_without_its_own_lease_a_node_adopts_nothing(tmp_path: Path) -> None:
    gateway, clock, two, _ = _two_survivors(tmp_path)
    a2 = two.arbiter()
    clock.advance(2.5)  # not renewed for two thirds of the 3 s TTL (the service is not running)
    calls = len(gateway.calls)
    assert a2.decide(1, 5, [], clock.seconds()) == (WAIT, None)
    assert len(gateway.calls) == calls  # nothing asked under a lease that may be gone
    assert "does not hold its id" in str(a2.status()[0]["waiting"])


def test_a_peer_that_says_it_adopted_is_believed_and_etcd_errors_wait(tmp_path: Path) -> None:
    gateway, clock, two, _ = _two_survivors(tmp_path)
    a2 = two.arbiter()
    assert a2.decide(1, 5, [(3, wire.ADOPTED)], clock.seconds()) == (FORGET, 3)
    gateway.down = True
    assert a2.decide(1, 5, [], clock.seconds()) == (WAIT, None)
    assert "no etcd endpoint answered" in str(a2.status()[0]["waiting"])
    gateway.down = False
    assert a2.decide(1, 5, [], clock.seconds()) == (WAIT, None)
    assert a2.decide(1, 5, [], clock.seconds()) == (ADOPT, None)
