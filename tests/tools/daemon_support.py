"""Starting nsqtw's drop-in daemons as subprocesses, the way client libraries' test suites start Go's."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from twisted.internet import threads
from twisted.internet.utils import getProcessOutputAndValue

from tools_support import reactor, wait_for

ROOT = str(Path(__file__).resolve().parents[2])
LISTENING = re.compile(r"^\[(\w+)\] \d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d{6} INFO: (TCP|HTTP|HTTPS): listening on (\S+):(\d+)$",
                       re.M)


def env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), PYTHONUNBUFFERED="1")


_handed_out: set[int] = set()


def free_port() -> int:
    """A loopback port nothing listens on, never one this process handed out before (the kernel may
    give the same ephemeral port to two quick binds in a row)."""
    while True:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        if port not in _handed_out:
            _handed_out.add(port)
            return port


class Daemon:
    """``python -m nsqtw.cli <prog> <flags>`` with stderr in a file the test can watch."""

    def __init__(self, tmp: Path, prog: str, *flags: str, cwd: Path | None = None,
                 module: str | None = None, script: Path | None = None) -> None:
        self.prog = prog
        self.err_path = tmp / f"{prog}-{len(list(tmp.glob(prog + '-*.err')))}.err"
        self._err = open(self.err_path, "wb")
        if script is not None:
            argv = [sys.executable, str(script)]
        elif module:
            argv = [sys.executable, "-m", module]
        else:
            argv = [sys.executable, "-m", "nsqtw.cli", prog]
        self.proc = subprocess.Popen(argv + list(flags), stdout=subprocess.PIPE, stderr=self._err,
                                     env=env(), cwd=str(cwd or tmp))

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def addresses(self) -> dict[str, tuple[str, int]]:
        return {m.group(2): (m.group(3), int(m.group(4))) for m in LISTENING.finditer(self.stderr())}

    async def listening(self, *labels: str, timeout: float = 30.0) -> dict[str, tuple[str, int]]:
        labels = labels or ("TCP", "HTTP")
        await wait_for(lambda: all(label in self.addresses() for label in labels) or self.proc.poll() is not None,
                       timeout, f"{self.prog} listening")
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.prog} exited {self.proc.returncode}:\n{self.stderr()}")
        return self.addresses()

    def address(self, label: str) -> str:
        host, port = self.addresses()[label]
        return f"{host}:{port}"

    async def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return await threads.deferToThread(self.proc.wait, timeout)
        finally:
            self.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        if self.proc.stdout:
            self.proc.stdout.close()
        self._err.close()


PYNSQ_SCRIPT = textwrap.dedent(r'''
    import json, sys
    import nsq
    import tornado.ioloop

    nsqd, lookupd, topic, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    loop = tornado.ioloop.IOLoop.current()
    received, acked = [], [0]

    def handler(msg):
        received.append(msg.body.decode())
        if len(received) == n:
            loop.call_later(0.3, finish)
        return True

    def finish():
        print("RESULT " + json.dumps({"received": sorted(received), "acked": acked[0]}))
        sys.stdout.flush()
        loop.stop()

    def on_pub(conn, data):
        if not isinstance(data, nsq.Error):
            acked[0] += 1

    writer = nsq.Writer([nsqd])
    kw = dict(lookupd_http_addresses=["http://" + lookupd], lookupd_poll_interval=1) if lookupd else dict(nsqd_tcp_addresses=[nsqd])
    reader = None
    sent = [False]

    def try_publish():
        global reader
        if sent[0] or not writer.conns:
            return
        sent[0] = True
        for i in range(n):
            writer.pub(topic, ("m-%d" % i).encode(), callback=on_pub)
        loop.call_later(0.3, start_reader)

    def start_reader():
        nsq.Reader(topic=topic, channel="pynsq", message_handler=handler, max_in_flight=n, **kw)

    tornado.ioloop.PeriodicCallback(try_publish, 20).start()
    loop.call_later(25, lambda: (print("TIMEOUT " + json.dumps({"received": len(received)})), loop.stop()))
    loop.start()
''')


async def pynsq_round_trip(tmp: Path, nsqd_tcp: str, topic: str, n: int = 20, lookupd_http: str = "") -> dict[str, Any]:
    """pynsq's Writer publishes n messages to nsqd, its Reader (direct or through lookupd) gets them back."""
    import json

    script = tmp / "pynsq_round_trip.py"
    script.write_text(PYNSQ_SCRIPT)
    d = getProcessOutputAndValue(sys.executable, [str(script), nsqd_tcp, lookupd_http, topic, str(n)], env=env())
    d.addTimeout(60, reactor())
    out, err, code = await d
    text = out.decode()
    assert "RESULT " in text, f"pynsq failed ({code}): {text}\n{err.decode()}"
    return json.loads(text.split("RESULT ", 1)[1])
