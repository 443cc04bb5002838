"""README's first screen tells a newcomer the ports, the durations and where the commands are, and its
twistd commands can run side by side from one directory (issue 28 items 2, 3, 6)."""

from __future__ import annotations

import re
from pathlib import Path

README = (Path(__file__).resolve().parents[1] / "README.rst").read_text()
FIRST = README[:README.index("\nEmbedding\n=========")]


def test_first_screen_says_ports_durations_and_where_the_commands_are():
    for needed in ("127.0.0.1:4150", "127.0.0.1:4171", "PORT_BASE=", "minutes", "make unit", "make quick",
                   ".venv/bin/", ". .venv/bin/activate", "pip install .", "pip install -e ."):
        assert needed in FIRST, needed


def test_the_running_the_daemons_block_passes_no_pidfile():
    """Started from one directory, the block's twistd commands must not collide on twistd.pid."""
    block = FIRST[FIRST.index("Running the daemons"):]
    commands = [line.strip() for line in block.splitlines() if line.strip().startswith("twistd -n ")]
    assert len(commands) == 4
    assert all(" --pidfile= " in c for c in commands), commands


def test_make_targets_named_in_readme_exist():
    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    for target in set(re.findall(r"``make ([a-z-]+)", README)):
        assert re.search(rf"^{re.escape(target)}:", makefile, re.M), target
