"""A data path where nsqd.dat cannot be written refuses the start, as Go's nsqd does."""

from __future__ import annotations

import os
import subprocess
import tempfile

import pytest
import pytest_twisted

from nsqtw.embed import start_nsqd


@pytest.fixture
def read_only_dir():
    path = tempfile.mkdtemp(prefix="nsqtw-ro-")
    mounted = False
    if os.geteuid() == 0:  # root writes through permission bits: use a read-only mount
        rc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", path], capture_output=True)
        mounted = rc.returncode == 0
    if not mounted:
        os.chmod(path, 0o555)
        try:
            open(os.path.join(path, "probe"), "w").close()
        except OSError:
            pass
        else:
            os.unlink(os.path.join(path, "probe"))
            os.rmdir(path)
            pytest.skip("cannot make a read-only directory here")
    try:
        yield path
    finally:
        if mounted:
            subprocess.run(["umount", "-l", path], capture_output=True)
        os.chmod(path, 0o755)
        os.rmdir(path)


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_read_only_data_path_refuses_to_start(read_only_dir):
    with pytest.raises(Exception) as info:
        await start_nsqd(data_path=read_only_dir)
    assert "failed to persist metadata" in str(info.value)
    assert "Read-only file system" in str(info.value) or "Permission denied" in str(info.value)
