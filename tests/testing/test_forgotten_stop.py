"""An embedded nsqd with a data_path of its own, never stopped, does not outlive its reactor:
SIGTERM stops the reactor and the process exits (its disk sync thread goes with the reactor),
with a warning naming where the broker was started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading

import pytest
import pytest_twisted

CHILD = textwrap.dedent("""
    import sys, threading
    from twisted.internet import reactor
    from twisted.logger import globalLogBeginner, textFileLogObserver
    globalLogBeginner.beginLoggingTo([textFileLogObserver(sys.stderr)], redirectStandardIO=False)
    from nsqtw.embed import start_nsqd

    def started(nsqd):
        # a durable data path: the sync thread runs; stop() is never called
        assert any("nsqtw-diskqueue-sync" in t.name for t in threading.enumerate())
        print("READY", flush=True)

    def failed(f):
        print("FAILED", f.getErrorMessage(), flush=True)
        reactor.stop()

    reactor.callWhenRunning(lambda: start_nsqd(reactor, data_path=sys.argv[1]).addCallbacks(started, failed))
    reactor.run()
    print("REACTOR STOPPED", flush=True)
""")


def test_sigterm_ends_a_process_whose_embedded_nsqd_was_never_stopped():
    with tempfile.TemporaryDirectory() as data:
        proc = subprocess.Popen([sys.executable, "-c", CHILD, data], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        watchdog = threading.Timer(60, proc.kill)  # a child that never says READY must not hang the run
        watchdog.start()
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.strip() == "READY", line + proc.stderr.read() if proc.poll() is not None else line
            proc.send_signal(signal.SIGTERM)
            try:
                out, err = proc.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                pytest.fail("the process did not exit after SIGTERM: the sync thread outlived the reactor")
            assert "REACTOR STOPPED" in out
            assert proc.returncode == 0, err
            # the forgotten stop is reported, naming where the broker was started (the child's line)
            assert "the reactor is stopping but the broker started at <string>:" in err
            assert "was never stopped" in err
        finally:
            watchdog.cancel()
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest_twisted.ensureDeferred
async def test_a_stopped_embedded_nsqd_leaves_no_thread(tmp_path):
    from nsqtw.embed import start_nsqd

    def sync_threads() -> list[str]:
        return [t.name for t in threading.enumerate() if "nsqtw-diskqueue-sync" in t.name]

    before = sync_threads()
    nsqd = await start_nsqd(data_path=str(tmp_path))
    assert len(sync_threads()) == len(before) + 1
    await nsqd.stop()
    assert sync_threads() == before
