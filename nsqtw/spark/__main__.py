"""``python -m nsqtw.spark stats ...`` / ``python -m nsqtw.spark replay ...`` (same as the console scripts)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

USAGE = "usage: python -m nsqtw.spark {stats,replay} [options]  (--help after the command for its options)\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        sys.stdout.write(USAGE)
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "stats":
        from .stats import main as run
    elif command == "replay":
        from .replay import main as run
    else:
        sys.stderr.write(f"unknown command {command!r}\n" + USAGE)
        return 2
    return run(rest)


if __name__ == "__main__":
    sys.exit(main())
