"""What ``twistd -n nsqtw`` (``make run``) and the other twistd plugins log: NSQ's lines, each daemon
under its own name, from ``--log-level`` up (info by default), none of Twisted's chatter, and one line
saying what is served where (issue 28 item 4)."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from nsqtw.options import default_node_id

REPO = Path(__file__).resolve().parents[1]
TWISTD = [sys.executable, "-c", "import sys; sys.argv[0] = 'twistd'; from twisted.scripts.twistd import run; run()",
          "--nodaemon", "--pidfile="]
GO_LINE = re.compile(r"^\[(nsqd|nsqlookupd|nsqadmin|nsqtw)\] \d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d{6} "
                     r"(DEBUG|INFO|WARNING|ERROR|FATAL): ")
SUMMARY = re.compile(r"INFO: serving nsqlookupd tcp://127\.0\.0\.1:(\d+) http://127\.0\.0\.1:(\d+); "
                     r"nsqd tcp://127\.0\.0\.1:(\d+) http://127\.0\.0\.1:(\d+); nsqadmin http://127\.0\.0\.1:(\d+); "
                     r"data in (.+)$")
#: Go's access line (http_api.Log): status, method, URI, remote address, duration
ACCESS = re.compile(r"INFO: 200 GET /stats\?format=json \(127\.0\.0\.1:\d+\) [\d.]+(ns|µs|ms|s)$")


class Daemon:
    """A twistd process whose log (stdout under -n) is read line by line."""

    def __init__(self, args: list[str], cwd: Path, default_pidfile: bool = False) -> None:
        head = [a for a in TWISTD if a != "--pidfile="] if default_pidfile else TWISTD
        self.proc = subprocess.Popen([*head, *args], cwd=str(cwd), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)})
        self.lines: list[str] = []
        self._buf = b""

    def wait_for(self, pattern: re.Pattern[str], timeout: float = 60.0) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while True:
            for line in self.lines:
                m = pattern.search(line)
                if m:
                    return m
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None:
                raise AssertionError(f"no {pattern.pattern!r} in:\n" + "\n".join(self.lines))
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if ready:
                self._read()

    def _read(self) -> None:
        chunk = os.read(self.proc.stdout.fileno(), 65536)
        self._buf += chunk
        *done, self._buf = self._buf.split(b"\n")
        self.lines.extend(d.decode() for d in done)

    def stop(self) -> tuple[list[str], str]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        out, err = self.proc.communicate(timeout=60)
        self._buf += out
        self.lines.extend(d.decode() for d in self._buf.split(b"\n") if d)
        return self.lines, err.decode()


def _allinone(tmp_path: Path, *extra: str) -> Daemon:
    return Daemon(["nsqtw", "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", "--https-address=",
                   f"--data-path={tmp_path}", "--broadcast-address=127.0.0.1", "--lookupd-tcp-listen=127.0.0.1:0",
                   "--lookupd-http-listen=127.0.0.1:0", "--admin-http-address=127.0.0.1:0", *extra], tmp_path)


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read()


@pytest.mark.e2e
def test_allinone_log_names_each_daemon_and_says_what_is_served(tmp_path):
    daemon = _allinone(tmp_path)
    try:
        m = daemon.wait_for(SUMMARY)
        lookupd_tcp, lookupd_http, nsqd_tcp, nsqd_http, admin_http = m.groups()[:5]
        assert m.group(6) == str(tmp_path)
        # nsqadmin reads the cluster through nsqlookupd and nsqd: none of those requests is logged
        # at info; a request from outside is, in Go's access line (http_api.Log), and a /pub is not
        assert b"\"nodes\"" in _get(f"http://127.0.0.1:{admin_http}/api/nodes")
        _get(f"http://127.0.0.1:{nsqd_http}/stats?format=json")
        urllib.request.urlopen(f"http://127.0.0.1:{nsqd_http}/pub?topic=t", data=b"x", timeout=30).read()
        daemon.wait_for(ACCESS)
    finally:
        lines, err = daemon.stop()
    assert daemon.proc.returncode in (0, -signal.SIGTERM), err  # twistd ends with the signal it got
    assert lines and all(GO_LINE.match(line) for line in lines), "\n".join(lines)
    listening = [line.split(" ", 1)[0] + " " + line.split(": ", 1)[1] for line in lines if "listening on" in line]
    assert listening == [f"[nsqlookupd] TCP: listening on 127.0.0.1:{lookupd_tcp}",
                         f"[nsqlookupd] HTTP: listening on 127.0.0.1:{lookupd_http}",
                         f"[nsqd] TCP: listening on 127.0.0.1:{nsqd_tcp}",
                         f"[nsqd] HTTP: listening on 127.0.0.1:{nsqd_http}",
                         f"[nsqadmin] HTTP: listening on 127.0.0.1:{admin_http}"]
    assert len([line for line in lines if "INFO: serving " in line]) == 1
    firsts = {line.split(" ", 1)[0] + " " + line.split(": ", 1)[1] for line in lines[:4]}
    assert {"[nsqlookupd] nsqlookupd v1.3.0 (built w/nsqtw-0.1.0)", "[nsqd] nsqd v1.3.0 (built w/nsqtw-0.1.0)",
            f"[nsqd] ID: {default_node_id()}"} <= firsts, lines[:4]
    access = [line for line in lines if ACCESS.search(line)]
    assert len(access) == 1 and access[0].startswith("[nsqd] "), access
    # besides it, only nsqd's own question to nsqlookupd when /pub created topic t (Go's nsqd asks
    # too, and Go's nsqlookupd logs it); nothing of nsqadmin's polling (/nodes, /topics, /stats)
    others = [line for line in lines if (" GET /" in line or " POST /" in line) and line not in access]
    assert all(re.search(r"^\[nsqlookupd\] .* INFO: 200 GET /channels\?topic=t \(", line) for line in others), others
    text = "\n".join(lines)
    for chatter in ("DEBUG", "HTTP/1.1", "starting on", "Starting factory", "Port ", "Closed", "Main loop"):
        assert chatter not in text, chatter


@pytest.mark.e2e
def test_log_level_debug_shows_heartbeats_and_requests(tmp_path):
    """``--log-level=debug``: the lookupd conversation and every HTTP request are logged too."""
    daemon = _allinone(tmp_path, "--log-level=debug")
    try:
        m = daemon.wait_for(SUMMARY)
        daemon.wait_for(re.compile(r"^\[nsqd\] .* INFO: LOOKUPD\(127\.0\.0\.1:\d+\): registering 0 topics"))
        # a topic created now: nsqd asks nsqlookupd for its channels first, and says so at debug level
        urllib.request.urlopen(f"http://127.0.0.1:{m.group(4)}/pub?topic=t", data=b"x", timeout=30).read()
        daemon.wait_for(re.compile(r"^\[nsqd\] .* DEBUG: CI: querying nsqlookupd http://127\.0\.0\.1:\d+/"))
        _get(f"http://127.0.0.1:{m.group(2)}/lookup?topic=t")
        daemon.wait_for(re.compile(r"^\[nsqlookupd\] .* INFO: 200 GET /lookup\?topic=t \(127\.0\.0\.1:\d+\) [\d.]+(µs|ms|s)$"))
        # nsqadmin's own requests to nsqlookupd (User-Agent nsqadmin/...) show at debug level only
        _get(f"http://127.0.0.1:{m.group(5)}/api/nodes")
        daemon.wait_for(re.compile(r"^\[nsqlookupd\] .* DEBUG: 200 GET /nodes \(127\.0\.0\.1:\d+\) "))
    finally:
        daemon.stop()


@pytest.mark.e2e
@pytest.mark.parametrize("plugin,args,prefix", [
    ("nsqd", ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", "--https-address="], "[nsqd] "),
    ("nsqlookupd", ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0"], "[nsqlookupd] "),
])
def test_single_daemon_logs_as_the_drop_in_command(tmp_path, plugin, args, prefix):
    """``twistd -n nsqd``: the drop-in command's lines (Go's layout, ``--log-prefix``), then the summary."""
    daemon = Daemon([plugin, *args, *([f"--data-path={tmp_path}"] if plugin == "nsqd" else [])], tmp_path)
    try:
        m = daemon.wait_for(re.compile(r"INFO: serving (\w+) tcp://127\.0\.0\.1:\d+ http://127\.0\.0\.1:\d+"))
        assert m.group(1) == plugin
    finally:
        lines, err = daemon.stop()
    assert all(line.startswith(prefix) and GO_LINE.match(line) for line in lines), "\n".join(lines)
    assert [line.split(": ", 1)[1].split(" on ")[0] for line in lines if "listening on" in line] == \
        ["TCP: listening", "HTTP: listening"]
    # twistd stops its application when SIGTERM stops the reactor: nothing is left running to warn about
    assert not [line for line in lines + err.splitlines() if "never stopped" in line], "\n".join(lines)



@pytest.mark.e2e
def test_two_foreground_twistd_from_one_directory(tmp_path):
    """``twistd -n`` writes no twistd.pid unless one is named, so README's daemons can all be started
    from one directory (twistd alone refuses the second: "Another twistd server is running")."""
    args = ["nsqlookupd", "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0"]
    first = Daemon(args, tmp_path, default_pidfile=True)
    try:
        first.wait_for(re.compile(r"INFO: serving nsqlookupd"))
        second = Daemon(args, tmp_path, default_pidfile=True)
        try:
            second.wait_for(re.compile(r"INFO: serving nsqlookupd"))
        finally:
            second.stop()
        assert not (tmp_path / "twistd.pid").exists()
    finally:
        first.stop()
