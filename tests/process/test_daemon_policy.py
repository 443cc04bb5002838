"""Every process nsqtw owns applies the one process policy before any listener opens (issue 23).

Each drop-in command (``nsqd``, ``nsqlookupd``, ``nsqadmin``) and each twistd plugin (``nsqd``,
``nsqlookupd``, ``nsqadmin``, the all-in-one ``nsqtw``) is started as its real entry point in a
subprocess (``policy_driver.py``), which records, at every ``listen``, what the policy had done:
start-up objects frozen out of the collector, full collections rare, the collector's pause
timing installed and the memory-trim service in the tree; and at exit, that nothing was frozen
after the first listener opened (so no connection object ever is) and that the trim loop ran.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nsqtw.runtime.process import FULL_COLLECTION_EVERY

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).resolve().parent / "policy_driver.py"

LOCAL_NSQD = ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", "--https-address=",
              "--broadcast-address=127.0.0.1"]
LOOKUPD = ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", "--broadcast-address=127.0.0.1"]
ADMIN = ["--http-address=127.0.0.1:0", "--nsqd-http-address=127.0.0.1:1"]
ALLINONE = ["--lookupd-tcp-listen=127.0.0.1:0", "--lookupd-http-listen=127.0.0.1:0",
            "--admin-http-address=127.0.0.1:0"]

ENTRY_POINTS = [
    ("cli", "nsqd", LOCAL_NSQD, True),
    ("cli", "nsqlookupd", LOOKUPD, False),
    ("cli", "nsqadmin", ADMIN, False),
    ("twistd", "nsqd", LOCAL_NSQD, True),
    ("twistd", "nsqlookupd", LOOKUPD, False),
    ("twistd", "nsqadmin", ADMIN, False),
    ("twistd", "nsqtw", ALLINONE + LOCAL_NSQD, True),
]


def run_entry_point(tmp_path: Path, kind: str, name: str, flags: list[str], data: bool) -> dict:
    out = tmp_path / "probe.json"
    args = list(flags) + ([f"--data-path={tmp_path}"] if data else [])
    env = dict(os.environ, POLICY_PROBE_OUT=str(out), PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(DRIVER), kind, name, *args], cwd=str(tmp_path), env=env,
                          capture_output=True, text=True, timeout=120)
    assert out.exists(), f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return json.loads(out.read_text())


@pytest.mark.e2e
@pytest.mark.parametrize("kind,name,flags,data", ENTRY_POINTS,
                         ids=[f"{kind}-{name}" for kind, name, _, _ in ENTRY_POINTS])
def test_daemon_applies_the_policy_before_its_first_listener(tmp_path, kind, name, flags, data):
    record = run_entry_point(tmp_path, kind, name, flags, data)
    listens = record["listens"]
    assert listens, record
    first = listens[0]
    assert first["freeze"] > 10_000, record  # every module, class and function imported by then
    assert first["full_every"] == FULL_COLLECTION_EVERY
    assert first["timing"] is True  # /stats' gc_pause_usec_* figures
    assert first["trim_created"] == 1  # one trim loop, in the daemon's tree
    # nothing frozen once a listener is open, so no connection object ever is (the count only
    # falls, as frozen objects are freed by reference counting)
    assert max(entry["freeze"] for entry in listens) == first["freeze"]
    assert record["at_exit"]["freeze"] <= first["freeze"], record
    assert record["trim_started"] == 1
