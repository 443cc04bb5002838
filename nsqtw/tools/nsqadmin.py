"""``python -m nsqtw.tools.nsqadmin``: the drop-in ``nsqadmin`` command (see :mod:`nsqtw.cli`)."""

from __future__ import annotations

import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run nsqadmin with Go's flags until SIGTERM/SIGINT."""
    from ..cli import nsqadmin_main

    return nsqadmin_main(argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
