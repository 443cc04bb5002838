"""RDY distribution, redistribution and backoff, checked against go-nsq's consumer.go outcomes."""

from __future__ import annotations

import pytest
from twisted.internet import task

from client_support import FakeConn, ScriptedRandom
from nsqtw.client.config import Config
from nsqtw.client.errors import Closing, OverMaxInFlight
from nsqtw.client.rdy import BACKOFF, CONTINUE, RDY_RETRY_DELAY, RESUME, RdyController


def make(mif: int = 10, picks=None, floats=None, **cfg):
    clock = task.Clock()
    rng = ScriptedRandom(picks, floats)
    ctl = RdyController(Config(max_in_flight=mif, **cfg), clock, rng)
    return ctl, clock, rng


def add(ctl, clock, *names, max_rdy=2500):
    conns = []
    for name in names:
        c = FakeConn(name, clock, max_rdy)
        ctl.add(c)
        conns.append(c)
    return conns


# --- distribution -------------------------------------------------------------------------


def test_per_conn_max_in_flight_formula():
    """perConnMaxInFlight = min(max(1, mif/conns), mif), truncated."""
    ctl, clock, _ = make(10)
    assert ctl.per_conn_max_in_flight() == 10
    add(ctl, clock, "a", "b", "c")
    assert ctl.per_conn_max_in_flight() == 3
    ctl2, clock2, _ = make(2)
    add(ctl2, clock2, "a", "b", "c")
    assert ctl2.per_conn_max_in_flight() == 1


def test_new_connections_shrink_existing_shares_exactly_as_go_nsq():
    """mif=10 over three nsqd: RDY 10, then 5/5, then 3/3/3 - each value written once."""
    ctl, clock, _ = make(10)
    a, = add(ctl, clock, "a")
    assert a.written == [10]
    b, = add(ctl, clock, "b")
    assert (a.written, b.written) == ([10, 5], [5])
    c, = add(ctl, clock, "c")
    assert (a.written, b.written, c.written) == ([10, 5, 3], [5, 3], [3])
    assert ctl.total_rdy == 9


def test_rdy_is_sent_only_when_the_value_changes():
    """Re-applying the same share writes nothing (RDY is a window on nsqd, not a per-message credit)."""
    ctl, clock, _ = make(10)
    a, b = add(ctl, clock, "a", "b")
    before = (list(a.written), list(b.written))
    for _ in range(5):
        ctl.maybe_update_rdy(a)
        ctl.maybe_update_rdy(b)
    assert (a.written, b.written) == before
    assert ctl.total_rdy == 10


def test_rdy_is_truncated_to_the_servers_max_rdy_count():
    """A connection never gets more than the max_rdy_count its nsqd announced."""
    ctl, clock, _ = make(100)
    a, = add(ctl, clock, "a", max_rdy=4)
    assert a.written == [4] and ctl.total_rdy == 4


def test_over_max_in_flight_retries_in_five_seconds():
    """mif=2, three conns: the third stays at RDY 0 with a 5 s retry that fails and re-arms."""
    ctl, clock, _ = make(2)
    a, b, c = add(ctl, clock, "a", "b", "c")
    assert (a.written, b.written, c.written) == ([2, 1], [1], [])
    assert ctl.total_rdy == 2
    assert "c" in ctl._retry and ctl._retry["c"].getTime() == RDY_RETRY_DELAY
    with pytest.raises(OverMaxInFlight):
        ctl.update_rdy(c, 1)
    clock.advance(RDY_RETRY_DELAY)
    assert c.written == [] and ctl._retry["c"].getTime() == 2 * RDY_RETRY_DELAY
    # once a unit is free, the retry succeeds
    ctl.update_rdy(b, 0)
    clock.advance(RDY_RETRY_DELAY)
    assert c.written == [1] and "c" not in ctl._retry and ctl.total_rdy == 2


def test_closing_connection_refuses_rdy():
    """go-nsq's ErrClosing: no RDY is written on a closing connection."""
    ctl, clock, _ = make(4)
    a, = add(ctl, clock, "a")
    a.closing = True
    with pytest.raises(Closing):
        ctl.update_rdy(a, 1)
    assert a.written == [4]


# --- redistribution ---------------------------------------------------------------------------


def test_redistribution_moves_rdy_from_idle_connections():
    """More conns than mif: an idle conn (no message for low_rdy_idle_timeout) gives its RDY to a random one."""
    ctl, clock, rng = make(2, picks=[2])
    a, b, c = add(ctl, clock, "a", "b", "c")
    clock.advance(8)
    a.last_msg_time = clock.seconds()  # a is busy, b is idle
    clock.advance(3)
    ctl.redistribute()
    assert (a.written, b.written, c.written) == ([2, 1], [1, 0], [1])
    assert ctl.total_rdy == 2 and a.rdy == 1 and b.rdy == 0 and c.rdy == 1
    assert "c" not in ctl._retry  # the successful update cancelled c's retry


def test_redistribution_takes_rdy_held_longer_than_low_rdy_timeout():
    """A conn holding RDY for low_rdy_timeout (30 s) gives it up even when busy."""
    ctl, clock, rng = make(1, picks=[1])
    a, b = add(ctl, clock, "a", "b")
    assert (a.written, b.written) == ([1], [])
    clock.pump([5] * 7)  # t=35; b's 5 s retries keep failing
    a.last_msg_time = clock.seconds() - 1
    ctl.redistribute()
    assert (a.written, b.written) == ([1, 0], [1])


def test_redistribution_is_idle_when_connections_fit():
    """conns <= mif and no backoff: the loop changes nothing."""
    ctl, clock, _ = make(10)
    a, b = add(ctl, clock, "a", "b")
    clock.advance(100)
    ctl.redistribute()
    assert (a.written, b.written) == ([10, 5], [5])


def test_connection_close_triggers_redistribution_of_its_rdy():
    """Closing a conn with RDY when the rest equal mif flags redistribution; its RDY leaves the total."""
    ctl, clock, rng = make(2, picks=[0])
    a, b, c = add(ctl, clock, "a", "b", "c")
    ctl.remove(b)
    assert ctl.total_rdy == 1 and ctl.need_redistribute
    ctl.redistribute()  # 2 conns == mif: still runs once because of the flag
    assert not ctl.need_redistribute
    # the free unit went to the randomly picked conn a, which already had RDY 1: no change
    assert ctl.total_rdy == 1 and a.written == [2, 1] and c.written == []
    clock.advance(RDY_RETRY_DELAY)  # c's pending retry now fits
    assert ctl.total_rdy == 2 and a.rdy == 1 and c.written == [1]


def test_is_starved_at_85_percent_of_rdy():
    """IsStarved: in_flight >= int(0.85 × RDY) and > 0 on a conn that is not closing."""
    ctl, clock, _ = make(20)
    a, = add(ctl, clock, "a")
    a.in_flight = 16
    assert not ctl.is_starved()
    a.in_flight = 17
    assert ctl.is_starved()
    a.closing = True
    assert not ctl.is_starved()


def test_change_max_in_flight_zero_pauses_and_restores():
    """ChangeMaxInFlight(0) sends RDY 0 everywhere; raising it again restores the shares."""
    ctl, clock, _ = make(4)
    a, b = add(ctl, clock, "a", "b")
    ctl.change_max_in_flight(0)
    assert (a.written[-1], b.written[-1], ctl.total_rdy) == (0, 0, 0)
    ctl.change_max_in_flight(4)
    assert (a.rdy, b.rdy, ctl.total_rdy) == (2, 2, 4)


# --- backoff ---------------------------------------------------------------------------------


def test_backoff_zeroes_all_then_tests_one_connection_then_recovers():
    """Failure: RDY 0 everywhere for 2 s; then RDY 1 on one random conn; a success restores the shares."""
    ctl, clock, rng = make(4, picks=[1])
    a, b = add(ctl, clock, "a", "b")
    ctl.signal(BACKOFF)
    assert ctl.backoff_counter == 1 and ctl.backoff_duration == 2.0
    assert (a.written, b.written) == ([4, 2, 0], [2, 0])
    ctl.signal(RESUME)  # ignored during the sleep
    ctl.signal(BACKOFF)  # ignored during the sleep
    assert ctl.backoff_counter == 1
    clock.advance(1.999)
    assert b.written == [2, 0]
    clock.advance(0.001)
    assert (a.written, b.written) == ([4, 2, 0], [2, 0, 1])
    assert not ctl.in_backoff_timeout() and ctl.in_backoff()
    ctl.signal(RESUME)
    assert ctl.backoff_counter == 0
    assert (a.written, b.written) == ([4, 2, 0, 2], [2, 0, 1, 2])
    assert ctl.total_rdy == 4


def test_exponential_backoff_grows_with_each_failure_after_a_sleep():
    """Two failures in a row: 2 s, then RDY 1, then 4 s; each success steps one level down."""
    ctl, clock, rng = make(1)
    a, = add(ctl, clock, "a")
    ctl.signal(BACKOFF)
    clock.advance(2)
    assert a.written == [1, 0, 1]
    ctl.signal(BACKOFF)
    assert ctl.backoff_counter == 2 and ctl.backoff_duration == 4.0
    assert a.written == [1, 0, 1, 0]
    clock.advance(3.9)
    assert a.written[-1] == 0
    clock.advance(0.1)
    assert a.written == [1, 0, 1, 0, 1]
    ctl.signal(RESUME)  # 2 -> 1: still backing off, 2 s at RDY 0
    assert ctl.backoff_counter == 1 and ctl.backoff_duration == 2.0 and a.written[-1] == 0
    clock.advance(2)
    ctl.signal(RESUME)  # 1 -> 0: out
    assert ctl.backoff_counter == 0 and a.written == [1, 0, 1, 0, 1, 0, 1]
    assert ctl.backoffs == 3


def test_backoff_level_is_capped_by_max_backoff_duration():
    """The level rises only while strategy(level+1) <= max_backoff_duration; the sleep is capped too."""
    ctl, clock, rng = make(1, max_backoff_duration=5.0)
    a, = add(ctl, clock, "a")
    for expected_level, expected_sleep in [(1, 2.0), (2, 4.0), (2, 4.0), (2, 4.0)]:
        ctl.signal(BACKOFF)
        assert (ctl.backoff_counter, ctl.backoff_duration) == (expected_level, expected_sleep)
        clock.advance(expected_sleep)


def test_max_backoff_duration_zero_disables_backoff():
    """With max_backoff_duration=0 the level never rises: no RDY change on failure."""
    ctl, clock, rng = make(4, max_backoff_duration=0.0)
    a, = add(ctl, clock, "a")
    ctl.signal(BACKOFF)
    assert ctl.backoff_counter == 0 and not ctl.in_backoff_timeout() and a.written == [4]


def test_full_jitter_strategy_sleeps_a_random_part_of_the_window():
    """full_jitter: the sleep is rng × multiplier × 2^level."""
    ctl, clock, rng = make(2, floats=[0.9, 0.25], backoff_strategy="full_jitter")
    a, = add(ctl, clock, "a")
    ctl.signal(BACKOFF)
    assert ctl.backoff_counter == 1 and ctl.backoff_duration == pytest.approx(0.5)
    clock.advance(0.5)
    assert a.written == [2, 0, 1]


def test_continue_rearms_the_sleep_at_the_same_level():
    """REQ without backoff while backing off: go-nsq keeps the level and sleeps again; at level 0 nothing."""
    ctl, clock, rng = make(2)
    a, = add(ctl, clock, "a")
    ctl.signal(CONTINUE)
    assert ctl.backoff_counter == 0 and a.written == [2]
    ctl.signal(BACKOFF)
    clock.advance(2)
    ctl.signal(CONTINUE)
    assert ctl.backoff_counter == 1 and ctl.backoff_duration == 2.0 and a.written == [2, 0, 1, 0]


def test_resume_without_connections_backs_off_one_more_second():
    """No connection to test the waters with: back off 1 s and try again."""
    ctl, clock, rng = make(2)
    a, = add(ctl, clock, "a")
    ctl.signal(BACKOFF)
    ctl.remove(a)
    clock.advance(2)
    assert ctl.backoff_duration == 1.0
    b, = add(ctl, clock, "b")  # no RDY while backing off
    assert b.written == []
    clock.advance(1)
    assert b.written == [1] and not ctl.in_backoff_timeout()


def test_backoff_with_several_connections_moves_the_single_rdy_off_an_idle_one():
    """In backoff, redistribution keeps one RDY in total and moves it away from an idle conn."""
    ctl, clock, rng = make(4, picks=[1, 0])
    a, b = add(ctl, clock, "a", "b")
    ctl.signal(BACKOFF)
    clock.advance(2)  # resume picks b
    assert b.rdy == 1 and a.rdy == 0
    clock.advance(11)  # b got nothing for > low_rdy_idle_timeout
    ctl.redistribute()  # b -> 0, then the free unit goes to a
    assert (a.rdy, b.rdy, ctl.total_rdy) == (1, 0, 1)
    assert b.written == [2, 0, 1, 0] and a.written == [4, 2, 0, 1]


def test_redistribution_is_skipped_during_a_backoff_sleep():
    """rdyLoop does nothing while the consumer sleeps in backoff."""
    ctl, clock, rng = make(1)
    a, b, c = add(ctl, clock, "a", "b", "c")
    ctl.signal(BACKOFF)
    snapshot = [list(x.written) for x in (a, b, c)]
    clock.advance(1)
    ctl.redistribute()
    assert [x.written for x in (a, b, c)] == snapshot


def test_stop_cancels_timers():
    """After stop no resume or retry fires."""
    ctl, clock, rng = make(1)
    a, b = add(ctl, clock, "a", "b")
    ctl.signal(BACKOFF)
    ctl.stop()
    assert clock.getDelayedCalls() == []
