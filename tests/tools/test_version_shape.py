"""``--version`` and the startup line have Go's shape: ``nsqd v1.3.0 (built w/<one token>)``, which
client libraries' harnesses parse with a regular expression (issue 14 item 1)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

# the expression one popular Python client's integration harness matches Go's output with
HARNESS = re.compile(r"^[a-z]+ v\d+\.\d+\.\d+(-[a-z]+)? \(built w/[a-z0-9.-]+\)")
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("daemon", ["nsqd", "nsqlookupd", "nsqadmin"])
def test_version_of_every_daemon_matches_the_harness_expression(daemon: str) -> None:
    out = subprocess.run([sys.executable, "-m", "nsqtw.cli", daemon, "--version"], cwd=str(ROOT),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    line = out.stdout.strip()
    assert HARNESS.match(line), line
    assert line == f"{daemon} v1.3.0 (built w/nsqtw-0.1.0)"


def test_go_nsqd_prints_the_same_shape() -> None:
    go = ROOT.parent / "shared" / "anchors" / "go-nsq-1.3.0" / "nsqd"
    if not go.exists():
        pytest.skip(f"Go's nsqd is not at {go}")
    line = subprocess.run([str(go), "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    assert HARNESS.match(line), line


def test_version_line_and_stats_text_share_the_shape() -> None:
    from nsqtw import version_line
    from nsqtw.nsqd.stats.snapshot import render_text

    assert HARNESS.match(version_line("nsqd"))
    text = render_text({"health": "OK", "topics": []}, 10.0, 0.0)
    assert text.splitlines()[0] == version_line("nsqd")


def test_app_version_matches_too() -> None:
    out = subprocess.run([sys.executable, "-m", "nsqtw.tools.tail", "--version"], cwd=str(ROOT),
                         capture_output=True, text=True, timeout=60)
    # the apps' names have an underscore (Go's too: nsq_tail v1.3.0 (built w/go1.19.8))
    assert re.match(r"^nsq_tail v\d+\.\d+\.\d+ \(built w/[a-z0-9.-]+\)$", out.stdout.strip()), out.stdout + out.stderr
