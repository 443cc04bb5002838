"""to_nsq: stdin records split on a one-byte delimiter reach every nsqd; --rate throttles on an
injected task.Clock; a subprocess run reads real stdin and exits 0 at end of input."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import pytest_twisted
from twisted.internet import task, threads

from nsqtw.options import OptionError
from nsqtw.tools.to_nsq import ToNsq, ToNsqOptions, TokenBucket

from tools_support import drain, reactor, tool_options, wait_for, within

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("argv,message", [
    (["--nsqd-tcp-address=a:1"], "--topic required"),
    (["--topic=t", "--nsqd-tcp-address=a:1", "--delimiter=ab"], "--delimiter must be a single byte"),
    (["--topic=t"], "--nsqd-tcp-address required"),
])
def test_flag_checks(argv, message):
    """Go's refusals: no topic, a delimiter longer than one byte, no nsqd."""
    with pytest.raises(OptionError, match=message):
        tool_options(ToNsqOptions, *argv)


def test_token_bucket_on_clock():
    """One token to start, `rate` a second after that, at most a second's worth banked."""
    clock = task.Clock()
    b = TokenBucket(4, clock)
    assert b.take() == 0.0
    assert b.take() == pytest.approx(0.25)
    clock.advance(10)
    assert [b.take() for _ in range(4)] == [0.0] * 4
    assert b.take() > 0


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_records_go_to_every_nsqd(nsqd, nsqtw_nsqd_factory):
    """Each non-empty record (a comma delimiter here) is published to both nsqd; EOF ends the app with 0."""
    other = await nsqtw_nsqd_factory()
    opts = tool_options(ToNsqOptions, "--topic=lines", "--delimiter=,", f"--nsqd-tcp-address={nsqd.tcp_address}",
                        f"--nsqd-tcp-address={other.tcp_address}")
    app = ToNsq(opts)
    await app.start()
    app.data_received(b"one,two,,thr")
    app.data_received(b"ee,")
    app.data_received(b"last-without-delimiter")
    app.end_of_input()
    assert await within(app.done) == 0
    assert app.published == 4
    assert await drain(nsqd, "lines", "c", 4) == [b"one", b"two", b"three", b"last-without-delimiter"]
    assert other.depth("lines") == 4


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_rate_limit_on_task_clock(nsqd):
    """--rate=10: one message at once, then one per 0.1 s of the injected clock and no faster."""
    clock = task.Clock()
    opts = tool_options(ToNsqOptions, "--topic=slow", "--rate=10", f"--nsqd-tcp-address={nsqd.tcp_address}")
    app = ToNsq(opts, clock=clock)
    await app.start()
    app.data_received(b"a\nb\nc\nd\n")
    await wait_for(lambda: app.published == 1, what="first publish")
    await task.deferLater(reactor(), 0.05, lambda: None)
    assert app.published == 1  # real time passing does not matter, only the clock
    clock.advance(0.1)
    await wait_for(lambda: app.published == 2, what="second publish")
    clock.advance(0.05)
    await task.deferLater(reactor(), 0.05, lambda: None)
    assert app.published == 2
    clock.advance(0.05)
    await wait_for(lambda: app.published == 3, what="third publish")
    clock.advance(0.1)
    await wait_for(lambda: app.published == 4, what="fourth publish")
    app.end_of_input()
    assert await within(app.done) == 0
    assert nsqd._broker.topics["slow"].depth() == 4


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_publish_failure_is_fatal(nsqd):
    """A publish nsqd refuses (a body over --max-msg-size) ends to_nsq with exit code 1."""
    opts = tool_options(ToNsqOptions, "--topic=big", f"--nsqd-tcp-address={nsqd.tcp_address}")
    app = ToNsq(opts)
    await app.start()
    app.data_received(b"x" * (nsqd.options.max_msg_size + 1) + b"\n")
    assert await within(app.done) == 1


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_command_reads_stdin(nsqd):
    """`python -m nsqtw.tools.to_nsq` publishes piped stdin and exits 0 at EOF."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    argv = [sys.executable, "-m", "nsqtw.tools.to_nsq", "--topic=piped", f"--nsqd-tcp-address={nsqd.tcp_address}"]

    def run() -> subprocess.CompletedProcess:
        return subprocess.run(argv, input=b"alpha\nbeta\ngamma\n", env=env, capture_output=True, timeout=30)

    result = await threads.deferToThread(run)
    assert result.returncode == 0, result.stderr.decode()
    assert await drain(nsqd, "piped", "c", 3) == [b"alpha", b"beta", b"gamma"]
