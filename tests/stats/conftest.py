"""Fixtures for the exporter tests."""

from __future__ import annotations

import pytest
from twisted.internet import task


@pytest.fixture
def clock() -> task.Clock:
    """A task.Clock set to 2023-11-14T22:13:20Z."""
    c = task.Clock()
    c.advance(1_700_000_000)  # 2023-11-14T22:13:20Z
    return c
