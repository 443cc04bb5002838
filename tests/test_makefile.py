"""``make run`` takes its ports as variables and installs only when a source changed (issue 28 items 1, 5)."""

from __future__ import annotations

import os
import random
import re
import select
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
VENV = REPO / ".venv"

pytestmark = pytest.mark.skipif(shutil.which("make") is None or not (VENV / "bin" / "twistd").exists(),
                                reason="needs make and the checkout's .venv (make test creates it)")


def _free_base() -> int:
    """A PORT_BASE whose six ports (+0 +1 +2 +10 +11 +21) are free now."""
    for _ in range(50):
        base = random.randrange(20000, 60000)
        socks = []
        try:
            for offset in (0, 1, 2, 10, 11, 21):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", base + offset))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError("no free port range")


@pytest.mark.e2e
def test_make_run_takes_port_base_and_says_what_is_served(tmp_path):
    """``make run PORT_BASE=N DATA=...``: nsqd on N/N+1, nsqlookupd on N+10/N+11, nsqadmin on N+21,
    the start's summary line saying so, and a working broker on the moved port."""
    base = _free_base()
    proc = subprocess.Popen(["make", "--no-print-directory", "run", f"PORT_BASE={base}", f"DATA={tmp_path}/data"],
                            cwd=str(REPO), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    out = b""
    try:
        deadline = time.monotonic() + 180  # an install first, if a source changed since the last one
        while b"INFO: serving " not in out:
            left = deadline - time.monotonic()
            assert left > 0 and proc.poll() is None, out.decode()
            if select.select([proc.stdout], [], [], left)[0]:
                out += os.read(proc.stdout.fileno(), 65536)
        with socket.create_connection(("127.0.0.1", base + 1), timeout=30) as c:
            c.sendall(b"GET /ping HTTP/1.0\r\n\r\n")
            assert c.recv(4096).endswith(b"OK")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        out += proc.communicate(timeout=60)[0]
    summary = re.search(r"INFO: serving (.*)", out.decode()).group(1)
    assert summary == (f"nsqlookupd tcp://127.0.0.1:{base + 10} http://127.0.0.1:{base + 11}; "
                       f"nsqd tcp://127.0.0.1:{base} http://127.0.0.1:{base + 1}; "
                       f"nsqadmin http://127.0.0.1:{base + 21}; data in {tmp_path}/data")


def test_make_run_one_address_on_its_own():
    """Each address is a variable of its own too (``make run ADMIN_HTTP_ADDRESS=127.0.0.1:9000``)."""
    out = subprocess.run(["make", "-n", "--no-print-directory", "run", "ADMIN_HTTP_ADDRESS=127.0.0.1:9000",
                          "ARGS=--log-level=debug"], cwd=str(REPO), capture_output=True, text=True, check=True)
    assert "--admin-http-address=127.0.0.1:9000 --log-level=debug" in out.stdout
    assert "--tcp-address=127.0.0.1:4150 " in out.stdout and "--lookupd-http-listen=127.0.0.1:4161 " in out.stdout


def test_make_run_keeps_nsqadmins_history_beside_the_data():
    """``make run`` gives nsqadmin a history directory in the data directory, so a restart keeps the charts."""
    out = subprocess.run(["make", "-n", "--no-print-directory", "run", "DATA=/tmp/x"], cwd=str(REPO),
                         capture_output=True, text=True, check=True)
    assert "mkdir -p /tmp/x/nsqadmin" in out.stdout and "--admin-history-path=/tmp/x/nsqadmin " in out.stdout


def test_install_is_redone_only_when_a_source_changed(tmp_path):
    """The install's stamp: nothing to do while it is newer than every source, a reinstall once one changed."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    (venv / ".installed").touch()

    def plan() -> str:
        return subprocess.run(["make", "-n", "--no-print-directory", f"VENV={venv}", "install"], cwd=str(REPO),
                              capture_output=True, text=True, check=True).stdout

    assert "pip install" not in plan()
    old = (REPO / "setup.cfg").stat().st_mtime - 10
    os.utime(venv / ".installed", (old, old))
    assert "pip install --quiet ." in plan()
