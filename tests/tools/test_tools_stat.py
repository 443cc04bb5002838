"""nsq_stat against live daemons: the header and report lines in Go's layout, rates over --interval
on an injected clock, --count, the header every 25 lines, lookupd discovery summing two nsqd, and Go's
fatal errors."""

from __future__ import annotations

import io
import re

import pytest
import pytest_twisted
from twisted.internet import task

from nsqtw.options import OptionError
from nsqtw.tools.stat import ChannelTotals, NsqStat, StatOptions, format_header, format_line

from tools_support import tool_options, wait_for, within

LINE = re.compile(r"^ *-?\d+ +-?\d+ \| +\d+ +\d+ +\d+ +\d+ +\d+ \| +\d+ +\d+ +\d+ +\d+$")


def publish(nsqd, topic: str, bodies) -> None:
    nsqd._broker.publish(topic, list(bodies), nsqd._service.now())
    nsqd._service.settle()


def test_header_and_line_layout():
    """Go's exact column layout."""
    assert format_header() == (
        "------rate------+----------------depth----------------+--------------metadata---------------\n"
        "ingress  egress |   total     mem    disk inflt   def |     req     t-o         msgs clients\n")
    now = ChannelTotals(depth=7, memory_depth=5, backend_depth=2, in_flight_count=3, deferred_count=1,
                        requeue_count=4, timeout_count=6, message_count=120, client_count=2)
    before = ChannelTotals(depth=3, message_count=100)
    assert format_line(now, before, 2.0) == "     10       8 |       7       5       2     3     1 |       4       6          120       2\n"


@pytest.mark.parametrize("argv,message", [
    (["--nsqd-http-address=a:1"], "--topic and --channel are required"),
    (["--topic=t", "--channel=c"], "--nsqd-http-address or --lookupd-http-address required"),
    (["--topic=t", "--channel=c", "--nsqd-http-address=http://a:1"], "address should not contain scheme"),
    (["--topic=t", "--channel=c", "--nsqd-http-address=a:1", "--interval=0"], "--interval should be positive"),
])
def test_flag_checks(argv, message):
    """Go's refusals."""
    with pytest.raises(OptionError, match=message):
        tool_options(StatOptions, *argv)


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_rates_and_count_on_a_clock(nsqd):
    """--count=2 --interval=2s: a baseline, then two reports; 10 messages published in between show
    as ingress 5/s and egress 0 (nothing consumed); --count ends it with exit code 0."""
    publish(nsqd, "st", [b"x"])
    nsqd._broker.topics["st"].get_channel("ch", nsqd._service.now())
    clock = task.Clock()
    out = io.StringIO()
    app = NsqStat(tool_options(StatOptions, "--topic=st", "--channel=ch", f"--nsqd-http-address={nsqd.http_address}",
                               "--interval=2s", "--count=2"), clock=clock, out=out)
    await app.start()
    clock.advance(0)
    await wait_for(lambda: app.iteration == 1, what="baseline")
    publish(nsqd, "st", [b"m"] * 10)
    clock.advance(2)
    await wait_for(lambda: app.reports == 1, what="first report")
    lines = out.getvalue().splitlines()
    assert lines[:2] == format_header().splitlines()
    fields = lines[2].replace("|", " ").split()
    assert fields[:3] == ["5", "0", "11"] and fields[-2:] == ["11", "0"]  # 'x' waited at the topic
    assert LINE.match(lines[2])
    clock.advance(2)
    assert await within(app.done) == 0
    assert len(out.getvalue().splitlines()) == 4


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_header_every_25_lines_via_lookupd(nsqtw_cluster):
    """Through lookupd, both nsqd are summed; with --count=26 the header appears again before the 25th report."""
    a, b = nsqtw_cluster.nsqds
    for nsqd in (a, b):
        await nsqd.publish("both", b"x")
        nsqd._broker.topics["both"].get_channel("ch", nsqd._service.now())
    await nsqtw_cluster.lookupd.wait_for_producers(2, topic="both")
    clock = task.Clock()
    out = io.StringIO()
    app = NsqStat(tool_options(StatOptions, "--topic=both", "--channel=ch",
                               f"--lookupd-http-address={nsqtw_cluster.lookupd_http_address}",
                               "--interval=1s", "--count=26"), clock=clock, out=out)
    await app.start()
    while not app.finished:
        clock.advance(1)
        n = app.iteration
        await wait_for(lambda n=n: app.iteration > n or app.finished, what="a poll")
    assert await app.done == 0
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 + 24 + 2 + 2
    assert lines[26:28] == format_header().splitlines()
    assert all(LINE.match(line) for line in lines[2:26] + lines[28:])
    last = lines[-1].replace("|", " ").split()
    assert last[2] == "2" and last[-2:] == ["2", "0"]  # depth and messages: one per nsqd, summed


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_unknown_channel_is_fatal(nsqd):
    """A channel that does not exist: Go's 'failed to find channel' and exit code 1."""
    publish(nsqd, "nochan", [b"x"])
    app = NsqStat(tool_options(StatOptions, "--topic=nochan", "--channel=zzz", f"--nsqd-http-address={nsqd.http_address}",
                               "--interval=10ms"), out=io.StringIO())
    await app.start()
    assert await within(app.done) == 1
