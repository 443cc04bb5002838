"""The pytest helpers say which to await: docstrings and typed signatures (issue 28 item 7)."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from nsqtw.testing.pytest_plugin import ClusterFixture, LookupdFixture, NsqdFixture

REPO = Path(__file__).resolve().parents[1]


def _helpers():
    for cls in (NsqdFixture, LookupdFixture, ClusterFixture):
        for name, fn in vars(cls).items():
            if not name.startswith("_") and inspect.isfunction(fn):
                yield f"{cls.__name__}.{name}", fn


@pytest.mark.parametrize("name,fn", list(_helpers()), ids=[n for n, _ in _helpers()])
def test_every_helper_says_whether_to_await_it(name, fn):
    """A helper returning a Deferred is annotated ``Deferred[...]`` and its docstring says
    "A Deferred (await it)"; one answering at once says "not a Deferred"."""
    returns = inspect.signature(fn).return_annotation
    doc = inspect.getdoc(fn) or ""
    if str(returns).startswith("Deferred"):
        assert str(returns).startswith("Deferred["), f"{name}: say what it fires with"
        assert "A Deferred (await it)" in doc, name
    else:
        assert "not a Deferred" in doc, name


def test_awaiting_an_immediate_helper_is_a_mypy_error(tmp_path):
    """``await nsqtw_nsqd.depth(...)`` fails type checking; awaited helpers give typed results."""
    pytest.importorskip("mypy", reason="mypy comes with the lint extra (make lint installs it)")
    snippet = tmp_path / "snippet.py"
    snippet.write_text(
        "from nsqtw.testing.pytest_plugin import NsqdFixture\n\n\n"
        "async def check(nsqd: NsqdFixture) -> None:\n"
        "    await nsqd.publish('t', b'x')\n"
        "    messages = await nsqd.wait_for_messages('t', 'c', 1)\n"
        "    reveal_type(messages)\n"
        "    await nsqd.depth('t')\n")
    out = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--follow-imports=silent",
                          "--ignore-missing-imports", "--config-file=", str(snippet)],
                         cwd=str(REPO), capture_output=True, text=True, timeout=300)
    lines = [line for line in out.stdout.splitlines() if line.startswith(str(snippet))]
    assert lines == [f'{snippet}:7: note: Revealed type is "list[nsqtw.client.message.Message]"',
                     f'{snippet}:8: error: Incompatible types in "await" (actual type "int", expected type '
                     f'"Awaitable[Any]")  [misc]'], out.stdout
