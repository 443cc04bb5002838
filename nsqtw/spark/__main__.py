"""``python -m nsqtw.spark stats ...`` / ``python -m nsqtw.spark replay ...`` (same as the console scripts).

``python -m nsqtw.spark submit-file`` prints the path of the file ``spark-submit`` runs
(:mod:`nsqtw.spark.submit`): ``spark-submit --master yarn "$(python -m nsqtw.spark submit-file)" stats ...``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

USAGE = ("usage: python -m nsqtw.spark {stats,replay,submit-file,warm-up} [options]  (--help after the command "
         "for its options; submit-file prints the file to give spark-submit; warm-up builds the archive of "
         "Spark's classes that local jobs start with)\n")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        sys.stderr.write(USAGE)
        return 2
    if args[0] in ("-h", "--help"):
        sys.stdout.write(USAGE)
        return 0
    command, rest = args[0], args[1:]
    if command == "stats":
        from .stats import main as run
    elif command == "replay":
        from .replay import main as run
    elif command == "warm-up":
        from .classcache import main as build
        from .cli import entry_environment
        from .stats import warm_up_job

        entry_environment("local[2]")  # the warm-up job's master
        return build(rest, warm_up_job)
    elif command == "submit-file":
        sys.stdout.write(os.path.join(os.path.dirname(os.path.abspath(__file__)), "submit.py") + "\n")
        return 0
    else:
        sys.stderr.write(f"unknown command {command!r}\n" + USAGE)
        return 2
    return run(rest)


if __name__ == "__main__":
    sys.exit(main())
