"""A daemon that cannot bind one of its addresses refuses to start, whole, and leaves nothing held."""

from __future__ import annotations

import socket

import pytest
import pytest_twisted

from nsqtw.embed import start_nsqd


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_http_port_in_use_fails_start_and_releases_everything(tmp_path):
    """HTTP address taken: start_nsqd fails, its TCP port is closed again and the data path unlocked."""
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen(1)
    taken = blocker.getsockname()[1]
    try:
        with pytest.raises(Exception) as info:
            await start_nsqd(data_path=str(tmp_path), http_address=f"127.0.0.1:{taken}")
        assert "Address already in use" in str(info.value) or "in use" in repr(info.value)
        nsqd = await start_nsqd(data_path=str(tmp_path))  # the data path is free again
        await nsqd.stop()
    finally:
        blocker.close()
