"""
Test helpers for code that talks to NSQ, modelled on ``treq.testing``.

* :class:`~nsqtw.testing.raw.RawV2Client` / :func:`~nsqtw.testing.raw.connect_raw` speak TCP protocol V2 byte by byte
  over a real connection and let a test await the next frame.
* :func:`~nsqtw.testing.raw.command`, :func:`~nsqtw.testing.raw.body_command`, :func:`~nsqtw.testing.raw.identify_command`,
  :func:`~nsqtw.testing.raw.mpub_command` encode commands; :func:`~nsqtw.testing.raw.decode_frames` splits captured bytes.
* ``nsqtw.testing.certs`` makes throwaway TLS certificates;
  :mod:`nsqtw.testing.pytest_plugin` gives pytest fixtures for real brokers.

Names are imported on first use, so loading this package (pytest loads the
plugin into every run) costs nothing.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "RawV2Client",
    "connect_raw",
    "command",
    "body_command",
    "identify_command",
    "mpub_command",
    "decode_frames",
    "FRAME_RESPONSE",
    "FRAME_ERROR",
    "FRAME_MESSAGE",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import raw
        return getattr(raw, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
