"""README's first screen tells a newcomer the ports, the durations and where the commands are, and the
running guide's twistd commands can run side by side from one directory (issue 28 items 2, 3, 6)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.rst").read_text()
FIRST = README[:README.index("\nA 30-second tour\n")]
RUNNING = (ROOT / "docs" / "guide" / "running.rst").read_text()


def test_first_screen_says_ports_durations_and_where_the_commands_are():
    for needed in ("127.0.0.1:4150", "127.0.0.1:4171", "PORT_BASE=", "minutes", "make unit", "make quick",
                   ".venv/bin/", ". .venv/bin/activate"):
        assert needed in FIRST, needed


def test_the_running_guide_says_what_pip_install_means():
    for needed in ("pip install .", "pip install -e .", "editable_mode=strict"):
        assert needed in RUNNING, needed


def test_the_running_the_daemons_block_passes_no_pidfile():
    """Started from one directory, the block's twistd commands must not collide on twistd.pid."""
    commands = [line.strip() for line in RUNNING.splitlines() if line.strip().startswith("twistd -n ")]
    assert len(commands) == 4
    assert all(" --pidfile= " in c for c in commands), commands


def test_make_targets_named_in_readme_and_guides_exist():
    makefile = (ROOT / "Makefile").read_text()
    texts = [README] + [p.read_text() for p in (ROOT / "docs" / "guide").glob("*.rst")]
    for target in {t for text in texts for t in re.findall(r"``make ([a-z-]+)", text)}:
        assert re.search(rf"^{re.escape(target)}:", makefile, re.M), target
