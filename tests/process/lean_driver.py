"""Runs one drop-in daemon as its real entry point (``nsqtw.cli.main``) and, at exit, writes the
names of every module the process imported (a lazy module not yet loaded is listed apart) as JSON
to the file named by ``LEAN_PROBE_OUT``.  Nothing is imported before the command's own imports."""

from __future__ import annotations

import atexit
import json
import os
import sys

OUT = os.environ["LEAN_PROBE_OUT"]


@atexit.register
def write() -> None:
    loaded = sorted(name for name, module in list(sys.modules.items())
                    if type(module).__name__ != "_LazyModule")
    lazy = sorted(name for name, module in list(sys.modules.items()) if type(module).__name__ == "_LazyModule")
    with open(OUT, "w") as f:
        json.dump({"loaded": loaded, "lazy": lazy}, f)


from nsqtw.cli import main  # noqa: E402 - after the hook, as the console script would

sys.exit(main(sys.argv[1:]))
