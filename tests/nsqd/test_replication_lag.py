"""What an operator sees of replication, sans-IO: each peer's sync state (in sync, catching up,
down) and its lag in messages and seconds (:class:`PeerLag`, :func:`peer_stats`), and the
Prometheus families /metrics renders from the /stats ``replication`` section."""

from __future__ import annotations

from typing import Any

from nsqtw.nsqd.core.replication import PeerLag, ReplicationOrigin, peer_stats
from nsqtw.nsqd.stats.prometheus import render_metrics


def send(o: ReplicationOrigin, lag: PeerLag, now: float, messages: int) -> int:
    o.record("t", 0, b"m" * messages, messages)
    count = o.pending_count
    assert o.take_batch(now) is not None
    lag.sent(count)
    return o.last_sent


def test_lag_counts_unacknowledged_messages_and_the_age_of_the_oldest():
    o = ReplicationOrigin(["a", "b"], 1, False)
    lag = PeerLag(0.0)
    o.linked("a", 2, 0.0)
    o.linked("b", 3, 0.0)
    s1 = send(o, lag, 1.0, 3)
    send(o, lag, 2.0, 5)
    a, b = peer_stats(o, lag, 4.0)
    assert (a["sync_state"], a["lag_messages"], a["lag_seconds"], a["unacked_batches"]) == ("in_sync", 8, 3.0, 2)
    o.acked("a", s1)
    a, b = peer_stats(o, lag, 4.0)
    assert (a["lag_messages"], a["lag_seconds"]) == (5, 2.0)
    assert (b["lag_messages"], b["lag_seconds"]) == (8, 3.0)
    o.acked("a", s1 + 1)
    o.acked("b", s1 + 1)
    a, b = peer_stats(o, lag, 9.0)
    assert (a["lag_messages"], a["lag_seconds"], b["lag_messages"]) == (0, 0.0, 0)
    send(o, lag, 10.0, 1)
    assert [e["lag_messages"] for e in peer_stats(o, lag, 10.0)] == [1, 1]


def test_a_peer_down_lags_by_what_was_accepted_since_it_went_down():
    o = ReplicationOrigin(["a"], 1, True)
    lag = PeerLag(0.0)
    (never,) = peer_stats(o, lag, 5.0)  # never in sync since the start
    assert (never["sync_state"], never["state"], never["lag_seconds"]) == ("down", "connecting", 5.0)
    o.linked("a", 2, 5.0)
    lag.up("a")
    send(o, lag, 6.0, 2)
    o.unlinked("a", 7.0, "link lost")
    lag.down("a", 7.0)
    send(o, lag, 8.0, 4)
    o.connecting("a", 9.0)
    lag.down("a", 9.0)  # a retry does not move when it went down
    send(o, lag, 9.5, 1)
    (a,) = peer_stats(o, lag, 10.0)
    assert (a["sync_state"], a["lag_messages"], a["lag_seconds"]) == ("down", 5, 3.0)
    o.linked("a", 2, 11.0)
    lag.up("a")
    (a,) = peer_stats(o, lag, 11.0)
    assert (a["sync_state"], a["lag_messages"], a["lag_seconds"]) == ("in_sync", 0, 0.0)


def test_a_catching_up_peer_is_neither_in_sync_nor_down():
    o = ReplicationOrigin(["a"], 1, False)
    lag = PeerLag(0.0)
    o.peers["a"].state = "catching_up"
    (a,) = peer_stats(o, lag, 1.0)
    assert a["sync_state"] == "catching_up"


def test_metrics_show_peers_and_adopted_origins():
    rep = {"status": "degraded-refusing", "min_acks": 1, "peers_in_sync": 0, "replicated_messages": 12,
           "refused_publishes": 3, "degraded_mode": "refuse",
           "peers": [{"address": "127.0.0.1:4163", "sync_state": "down", "state": "out_of_sync",
                      "lag_messages": 7, "lag_seconds": 2.5, "unacked_batches": 0}],
           "shadows": [{"origin_node_id": 3, "unfinished_messages": 4, "topics": 1, "log_bytes": 99}],
           "adopted": [{"origin_node_id": 1, "epoch": 1_700_000_000_000_000_000, "messages": 8, "refused": 0,
                        "at": 1_700_000_000.0},
                       {"origin_node_id": 1, "epoch": 1_700_000_100_000_000_000, "messages": 2, "refused": 0,
                        "at": 1_700_000_100.0}]}
    text = render_metrics({"version": "1.3.0", "health": "OK", "start_time": 1, "topics": [],
                           "replication": rep}).decode()
    lines = set(text.splitlines())
    assert 'nsq_replication_peer_in_sync{peer="127.0.0.1:4163"} 0' in lines
    assert 'nsq_replication_peer_down{peer="127.0.0.1:4163"} 1' in lines
    assert 'nsq_replication_peer_lag_messages{peer="127.0.0.1:4163"} 7' in lines
    assert 'nsq_replication_peer_lag_seconds{peer="127.0.0.1:4163"} 2.5' in lines
    assert "nsq_replication_degraded 1" in lines and "nsq_replication_refused_publishes_total 3" in lines
    assert 'nsq_replication_shadow_messages{origin_node_id="3"} 4' in lines
    assert 'nsq_replication_adopted_messages_total{origin_node_id="1"} 10' in lines
    assert 'nsq_replication_adoptions_total{origin_node_id="1"} 2' in lines
    assert 'nsq_replication_last_adopted_epoch_seconds{origin_node_id="1"} 1700000100' in lines
    assert "# TYPE nsq_replication_adopted_messages_total counter" in lines
    plain = render_metrics({"version": "1.3.0", "health": "OK", "start_time": 1, "topics": []}).decode()
    assert "nsq_replication" not in plain


def test_metrics_show_failing_and_standing_by_adoptions_a_store_error_and_each_origins_last_heard():
    rep = {"status": "ok", "min_acks": 1, "peers_in_sync": 1, "peers": [], "store_error": "E_STORE_FAILED full",
           "origins": [{"origin_node_id": 1, "name": "a", "last_heard_seconds": 0.75, "batches": 3}],
           "adoption": {"failing": [{"origin_node_id": 4, "error": "OSError: No space left on device",
                                     "since_seconds": 3.0, "tries": 3, "adopted_so_far": 10}],
                        "standing_by": [{"origin_node_id": 5, "for_node_id": 2}], "adopted_by_peer": []}}
    lines = set(render_metrics({"version": "1.3.0", "health": "OK", "start_time": 1, "topics": [],
                                "replication": rep}).decode().splitlines())
    assert 'nsq_replication_origin_last_heard_seconds{origin_node_id="1"} 0.75' in lines
    assert 'nsq_replication_adoption_failing{origin_node_id="4"} 1' in lines
    assert 'nsq_replication_adoption_failed_tries{origin_node_id="4"} 3' in lines
    assert 'nsq_replication_adoption_standing_by{origin_node_id="5"} 1' in lines
    assert "nsq_replication_store_failing 1" in lines


class _Turn:
    """The end-of-turn hook, run by hand."""

    def __init__(self) -> None:
        self.calls: list[Any] = []

    def soon(self, fn: Any) -> None:
        if fn not in self.calls:
            self.calls.append(fn)

    def end(self) -> None:
        calls, self.calls = self.calls, []
        for fn in calls:
            fn()


class _Link:
    transport = object()

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def writev(self, parts: list[bytes]) -> None:
        self.sent.append(b"".join(parts))

    def write(self, data: bytes) -> None:
        self.sent.append(data)

    send = write
    send_parts = writev


def test_a_big_publish_goes_to_the_peers_at_once_and_small_ones_at_the_end_of_the_turn(tmp_path):
    """Two MPUBs read in one poll: the first is on its way to the peer before the second is
    handled (the peer stores it meanwhile); single PUBs of one turn still go as one batch."""
    from twisted.internet.task import Clock

    from nsqtw.nsqd.replication import ReplicationService
    from nsqtw.options import NsqdOptions

    turn = _Turn()
    service = ReplicationService(NsqdOptions(node_id=1, replication_insecure=True, replica_peers=["127.0.0.1:1"]), Clock(), instance=b"i" * 16,
                                 name="n", turn=turn, data_path=str(tmp_path))
    service.origin.linked("127.0.0.1:1", 2, 0.0)
    link = service.links["127.0.0.1:1"] = _Link()  # type: ignore[assignment]  # a stand-in link
    service.record("t", 0, b"m" * 200, 200)  # an MPUB of 200
    assert len(link.sent) == 1  # sent before the turn ends
    service.record("t", 0, b"m" * 200, 200)
    assert len(link.sent) == 2
    service.record("t", 0, b"a", 1)
    service.record("t", 0, b"b", 1)
    assert len(link.sent) == 2  # small ones wait for the end of the turn
    turn.end()
    assert len(link.sent) == 3 and b"a" in link.sent[2] and b"b" in link.sent[2]
    assert service.origin.last_sent == 3 and service.origin.pending == []


def test_a_held_publish_is_answered_by_a_plain_call_not_a_deferred(tmp_path):
    """The replication barrier of every replicated PUB is a plain callable (no Deferred and
    its callback chain per publish): called with None once the peer acknowledged, with the
    reason when the publish is refused; the Deferred form still works for HTTP."""
    from twisted.internet.task import Clock

    from nsqtw.nsqd.core.replication import PublishRefused
    from nsqtw.nsqd.replication import ReplicationService
    from nsqtw.options import NsqdOptions

    turn = _Turn()
    service = ReplicationService(NsqdOptions(node_id=1, replication_insecure=True, replica_peers=["127.0.0.1:1"]), Clock(), instance=b"i" * 16,
                                 name="n", turn=turn, data_path=str(tmp_path))
    answers: list[str | None] = []
    service.hold(answers.append)  # no peer in sync: refused at once, with the reason
    assert len(answers) == 1 and answers[0] is not None and "0 of 1 peers in sync" in answers[0]
    failed: list[object] = []
    service.barrier().addErrback(failed.append)
    assert failed and failed[0].check(PublishRefused)  # type: ignore[attr-defined]  # a Failure, typed as object here

    service.origin.linked("127.0.0.1:1", 2, 0.0)
    service.links["127.0.0.1:1"] = _Link()  # type: ignore[assignment]  # a stand-in link
    answers.clear()
    service.record("t", 0, b"a", 1)
    service.hold(answers.append)
    turn.end()
    assert answers == []  # held until the peer stored the batch
    service.acked("127.0.0.1:1", service.origin.last_sent)
    assert answers == [None]
    service.hold(answers.append)  # nothing new recorded: answered at once
    assert answers == [None, None]
