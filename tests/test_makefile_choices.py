"""The Makefile's interpreter, clean and docs choices, read with ``make -n`` (nothing is run or changed)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")


def dry_run(*args: str) -> str:
    # not what the make running this suite was given (``make test PYTHON=...`` passes it on)
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "PYTHON", "VENV")}
    done = subprocess.run(["make", "-n", "-B", *args], cwd=ROOT, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout


def system_python_can_make_a_venv() -> bool:
    if not Path("/usr/bin/python3").exists():
        return False
    check = "import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 10))"
    return subprocess.run(["/usr/bin/python3", "-c", check], capture_output=True).returncode == 0


def test_the_virtualenv_is_made_with_debians_python_when_it_can_make_one(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    first = dry_run(f"VENV={venv}", f"{venv}/bin/python").splitlines()[0]
    expected = "/usr/bin/python3" if system_python_can_make_a_venv() else "python3"
    assert first == f"{expected} -m venv {venv}"


def test_python_on_the_command_line_picks_the_interpreter(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    first = dry_run(f"VENV={venv}", f"PYTHON={sys.executable}", f"{venv}/bin/python").splitlines()[0]
    assert first == f"{sys.executable} -m venv {venv}"


def test_clean_keeps_the_tracked_guides() -> None:
    out = dry_run("clean")
    assert "docs/_build" in out
    assert "docs/guide" not in out
    assert (ROOT / "docs" / "guide" / "replication.rst").exists()


def test_docs_installs_the_test_extras_its_autodoc_imports() -> None:
    out = dry_run("docs")
    assert '".[docs,test]"' in out
