"""The examples run as written (each is a small program a user copies)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.e2e
def test_embedded_example():
    """examples/embedded.py starts a broker, round-trips a message and stops."""
    proc = _run("examples/embedded.py")
    assert proc.returncode == 0, proc.stderr
    assert "received: hello from an embedded nsqd" in proc.stdout


@pytest.mark.e2e
def test_inprocess_bus_example():
    """examples/inprocess_bus.py moves its messages over the in-process bus."""
    proc = _run("examples/inprocess_bus.py")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()


def test_embedded_example_passes_mypy_strict():
    """The embedding guide says its example is typed: ``mypy --strict examples/embedded.py`` passes."""
    pytest.importorskip("mypy", reason="mypy is installed by `make lint` (the lint extra)")
    proc = _run("-m", "mypy", "--strict", "--no-incremental", "examples/embedded.py", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
