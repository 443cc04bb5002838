"""Shared fixtures: an embedded nsqd on loopback port 0, and a raw V2 connection to it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import pytest_twisted

from fulldisk_support import small_tmpfs  # noqa: F401  (a fixture every test may ask for by name)

# no class-data-sharing archive of Spark's classes built in the background by the CLI jobs the tests
# run (nor one from the user's cache used): the tests of nsqtw.spark.classcache turn it on themselves
os.environ.setdefault("NSQTW_SPARK_CLASS_ARCHIVE", "off")

#: answers and files recorded from Go's nsqd 1.3.0 (copied from ../shared/fixtures; see the READMEs)
FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES


@pytest_twisted.async_yield_fixture
async def nsqd(request):
    """A fresh nsqd in this reactor; options via ``@pytest.mark.nsqd_options(...)``."""
    from nsqtw.embed import start_nsqd

    marker = request.node.get_closest_marker("nsqd_options")
    kwargs = dict(marker.kwargs) if marker else {}
    handle = await start_nsqd(**kwargs)
    yield handle
    await handle.stop()


@pytest_twisted.async_yield_fixture
async def raw(nsqd):
    """A raw V2 connection (magic sent) to the ``nsqd`` fixture."""
    from nsqtw.testing import connect_raw

    client = await connect_raw(nsqd.tcp_port)
    yield client
    await client.close()


def pytest_configure(config):
    config.addinivalue_line("markers", "nsqd_options(**kwargs): options for the nsqd fixture")
