"""A real full disk for the tests that need one: a small tmpfs the test mounts (root only; the
test skips saying why otherwise), and a file that fills it."""

from __future__ import annotations

import errno
import os
import subprocess
import tempfile

import pytest


@pytest.fixture
def small_tmpfs():
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    path = tempfile.mkdtemp(prefix="nsqtw-fulldisk-")
    rc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", path],
                        capture_output=True, text=True)
    if rc.returncode != 0:
        os.rmdir(path)
        pytest.skip(f"cannot mount a tmpfs here: {rc.stderr.strip() or rc.returncode}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", path], capture_output=True)
        os.rmdir(path)


def fill(path: str) -> str:
    """Write a file until the filesystem is full; its name."""
    name = os.path.join(path, "filler")
    chunk = b"\0" * 65536
    with open(name, "wb", buffering=0) as f:
        try:
            while True:
                f.write(chunk)
        except OSError as e:
            assert e.errno == errno.ENOSPC
    # the last partial chunk may have left a few bytes free: take them too
    with open(name, "ab", buffering=0) as f:
        try:
            while True:
                f.write(b"\0")
        except OSError as e:
            assert e.errno == errno.ENOSPC
    return name
