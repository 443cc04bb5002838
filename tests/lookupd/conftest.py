"""Fixtures for nsqlookupd tests: an embedded nsqlookupd, and nsqd attached to it."""

from __future__ import annotations

import pytest_twisted


@pytest_twisted.async_yield_fixture
async def lookupd(request):
    """A fresh nsqlookupd on 127.0.0.1 port 0; options via ``@pytest.mark.lookupd_options(...)``."""
    from nsqtw.embed import start_nsqlookupd

    marker = request.node.get_closest_marker("lookupd_options")
    kwargs = dict(marker.kwargs) if marker else {}
    handle = await start_nsqlookupd(**kwargs)
    yield handle
    await handle.stop()


def pytest_configure(config):
    config.addinivalue_line("markers", "lookupd_options(**kwargs): options for the lookupd fixture")
