"""The testing guide's examples (examples/test_testing_guide.py, included by
docs/guide/testing.rst) pass as a user runs them: a guide example that fails, fails the build."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.e2e
def test_the_testing_guide_examples_pass():
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "examples/test_testing_guide.py"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "6 passed" in proc.stdout


def test_the_guide_includes_every_example():
    guide = (ROOT / "docs" / "guide" / "testing.rst").read_text()
    source = (ROOT / "examples" / "test_testing_guide.py").read_text()
    names = [line.split("(")[0][len("async def "):] for line in source.splitlines()
             if line.startswith("async def test_")]
    assert names and all(f":pyobject: {name}" in guide for name in names)
