"""nsq_tail against a live in-process nsqd: -n stops after N, --print-topic, the ephemeral default
channel, --max-in-flight lowered to -n, and the flag checks Go makes."""

from __future__ import annotations

import random

import pytest
import pytest_twisted

from nsqtw.client.errors import NotConnected
from nsqtw.options import OptionError
from nsqtw.tools.tail import Tail, TailOptions, random_channel

from tools_support import Out, tool_options, wait_for, within


def test_default_channel_is_ephemeral_tail_six_digits():
    """Go's default channel: tail<6 digits>#ephemeral."""
    name = random_channel(random.Random(7))
    assert name.startswith("tail") and name.endswith("#ephemeral")
    assert len(name) == len("tail000000#ephemeral") and name[4:10].isdigit()


@pytest.mark.parametrize("argv,message", [
    (["--topic=t"], "--nsqd-tcp-address or --lookupd-http-address required"),
    (["--topic=t", "--nsqd-tcp-address=a:1", "--lookupd-http-address=b:2"],
     "use --nsqd-tcp-address or --lookupd-http-address not both"),
    (["--nsqd-tcp-address=a:1"], "--topic required"),
])
def test_flag_checks(argv, message):
    """The same refusals as Go's nsq_tail, word for word."""
    with pytest.raises(OptionError, match=message):
        tool_options(TailOptions, *argv)


def test_max_in_flight_lowered_to_n():
    """-n 5 with the default --max-in-flight 200 asks for 5 at most."""
    opts = tool_options(TailOptions, "--topic=t", "--nsqd-tcp-address=127.0.0.1:1", "-n", "5")
    app = Tail(opts, out=Out())
    assert app.max_in_flight == 5 and app.config.max_in_flight == 5
    assert app.channel.endswith("#ephemeral")
    assert app.config.user_agent.startswith("nsq_tail/1.3.0")


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_tail_n_prints_and_exits(nsqd):
    """-n 3 prints exactly three bodies, one per line, then finishes with exit code 0."""
    for i in range(5):
        nsqd._broker.publish("tailed", [b"line %d" % i], nsqd._service.now())
    out = Out()
    opts = tool_options(TailOptions, "--topic=tailed", f"--nsqd-tcp-address={nsqd.tcp_address}", "-n", "3")
    app = Tail(opts, out=out)
    await within(app.start())
    code = await within(app.done)
    assert code == 0
    assert out.lines() == [b"line 0", b"line 1", b"line 2"]
    # the ephemeral channel went away with the consumer; the other two stay at the topic? no: they were
    # copied to the channel, which is deleted once its last client left
    await wait_for(lambda: app.channel not in nsqd._broker.topics["tailed"].channels, what="ephemeral channel gone")


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_tail_print_topic_two_topics_until_stopped(nsqd):
    """--print-topic prefixes 'topic | '; two topics, one consumer each; stop() is graceful."""
    out = Out()
    opts = tool_options(TailOptions, "--topic=a", "--topic=b", "--channel=watch", "--print-topic",
                        f"--nsqd-tcp-address={nsqd.tcp_address}")
    app = Tail(opts, out=out)
    await within(app.start())
    assert len(app.consumers) == 2
    nsqd._broker.publish("a", [b"x"], nsqd._service.now())
    nsqd._broker.publish("b", [b"y"], nsqd._service.now())
    nsqd._service.settle()
    await wait_for(lambda: len(out.lines()) == 2, what="two lines")
    assert sorted(out.lines()) == [b"a | x", b"b | y"]
    assert await within(app.stop()) == 0
    assert nsqd._broker.topics["a"].channels["watch"].depth() == 0


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_unreachable_nsqd_fails_start():
    """A refused nsqd dial is fatal, as go-nsq's ConnectToNSQD error is for Go's nsq_tail."""
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    app = Tail(tool_options(TailOptions, "--topic=t", f"--nsqd-tcp-address=127.0.0.1:{port}"), out=Out())
    with pytest.raises(NotConnected):
        await within(app.start())
    await within(app.stop())
