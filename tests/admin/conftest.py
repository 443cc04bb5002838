"""Fixtures for the nsqadmin tests: embedded nsqd, nsqlookupd and nsqadmin on loopback port 0."""

from __future__ import annotations

from typing import Any

import pytest_twisted


@pytest_twisted.async_yield_fixture
async def nsqds():
    """Two fresh nsqd (nsqadmin is about clusters)."""
    from nsqtw.embed import start_nsqd

    handles = [await start_nsqd(), await start_nsqd()]
    yield handles
    for h in handles:
        await h.stop()


@pytest_twisted.async_yield_fixture
async def start_admin():
    """``await start_admin(**AdminOptions)`` -> a running nsqadmin, stopped after the test."""
    from nsqtw.embed import start_nsqadmin

    started: list[Any] = []

    async def start(**kwargs: Any) -> Any:
        handle = await start_nsqadmin(**kwargs)
        started.append(handle)
        return handle

    yield start
    for h in started:
        await h.stop()


@pytest_twisted.async_yield_fixture
async def admin(nsqds, start_admin, request):
    """nsqadmin in --nsqd-http-address mode over both ``nsqds``; options via ``admin_options``."""
    marker = request.node.get_closest_marker("admin_options")
    kwargs: dict[str, Any] = dict(marker.kwargs) if marker else {}
    kwargs.setdefault("nsqd_http_addresses", [n.http_address for n in nsqds])
    yield await start_admin(**kwargs)


@pytest_twisted.async_yield_fixture
async def cluster(start_admin, request):
    """(nsqadmin in --lookupd-http-address mode, lookupd, [nsqd, nsqd], [peers, peers])."""
    from admin_helpers import attach_lookupd
    from nsqtw.embed import start_nsqd
    from nsqtw.embed import start_nsqlookupd

    lookupd = await start_nsqlookupd()
    nodes = [await start_nsqd(lookupd_tcp_addresses=[lookupd.tcp_address]) for _ in range(2)]
    peers = [await attach_lookupd(n, lookupd) for n in nodes]
    marker = request.node.get_closest_marker("admin_options")
    kwargs: dict[str, Any] = dict(marker.kwargs) if marker else {}
    kwargs.setdefault("lookupd_http_addresses", [lookupd.http_address])
    admin = await start_admin(**kwargs)
    yield admin, lookupd, nodes, peers
    for n in nodes:
        await n.stop()
    await lookupd.stop()


@pytest_twisted.async_yield_fixture
async def browser():
    """Headless Chromium (``test_browser.Browser``); the browser test modules skip without it."""
    from twisted.internet import threads

    from admin_helpers import within
    from test_browser import Browser

    b = await within(threads.deferToThread(Browser.start), 60)
    yield b
    await within(threads.deferToThread(b.quit), 30)


def pytest_configure(config):
    config.addinivalue_line("markers", "admin_options(**kwargs): options for the admin / cluster fixtures")
