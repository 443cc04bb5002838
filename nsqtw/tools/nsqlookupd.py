"""``python -m nsqtw.tools.nsqlookupd``: the drop-in ``nsqlookupd`` command (see :mod:`nsqtw.cli`)."""

from __future__ import annotations

import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run nsqlookupd with Go's flags until SIGTERM/SIGINT."""
    from ..cli import nsqlookupd_main

    return nsqlookupd_main(argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
