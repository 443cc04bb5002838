"""``python -m nsqtw.tools.nsqd``: the drop-in ``nsqd`` command (see :mod:`nsqtw.cli`)."""

from __future__ import annotations

import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run nsqd with Go's flags until SIGTERM/SIGINT."""
    from ..cli import nsqd_main

    return nsqd_main(argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
