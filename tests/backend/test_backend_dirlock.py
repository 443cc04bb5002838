"""The data-path lock: a second broker on the same directory refuses to start."""

from __future__ import annotations

import subprocess
import sys

import pytest

from nsqtw.backend.dirlock import DataPathLocked, DirLock


def test_second_lock_refused_with_clear_message(tmp_path):
    """A second lock on a held directory fails with nsqd's message."""
    first = DirLock(str(tmp_path))
    first.lock()
    try:
        with pytest.raises(DataPathLocked) as ei:
            DirLock(str(tmp_path)).lock()
        assert str(ei.value) == (
            f"failed to lock data-path: cannot flock directory {tmp_path} - "
            "Resource temporarily unavailable (possibly in use by another instance of nsqd)")
    finally:
        first.unlock()


def test_unlock_releases(tmp_path):
    """After unlock the directory can be locked again."""
    with DirLock(str(tmp_path)) as lk:
        assert lk.locked
    again = DirLock(str(tmp_path))
    again.lock()
    assert again.locked
    again.unlock()
    assert not again.locked


def test_lock_held_across_processes(tmp_path):
    """Another process cannot take the lock while this one holds it."""
    lk = DirLock(str(tmp_path))
    lk.lock()
    try:
        code = ("import sys\nfrom nsqtw.backend.dirlock import DirLock, DataPathLocked\n"
                "try:\n    DirLock(sys.argv[1]).lock()\nexcept DataPathLocked as e:\n"
                "    print(e); sys.exit(3)\n")
        r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                           timeout=60, cwd=str(__import__("pathlib").Path(__file__).resolve().parents[2]))
        assert r.returncode == 3, r.stderr
        assert "possibly in use by another instance of nsqd" in r.stdout
    finally:
        lk.unlock()


def test_missing_directory(tmp_path):
    """Locking a directory that does not exist raises an OSError (not the 'in use' error)."""
    with pytest.raises(OSError) as ei:
        DirLock(str(tmp_path / "nope")).lock()
    assert not isinstance(ei.value, DataPathLocked)
