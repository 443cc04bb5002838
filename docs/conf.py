"""Sphinx configuration: the API reference (autodoc) and the guides, which are README.rst's sections.

``make docs`` builds it with warnings as errors.  The guide pages are cut from README.rst at build
time (README.rst stays the one source).  Intersphinx links to Twisted's documentation when a local
copy of its inventory is given (``NSQTW_TWISTED_INVENTORY`` or ``docs/_inventories/twisted.inv``):
the build never reaches for the network.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))

import nsqtw  # noqa: E402

project = "nsqtw"
author = "nsqtw's authors"
release = version = nsqtw.__version__

extensions = ["sphinx.ext.autodoc", "sphinx.ext.intersphinx", "sphinx.ext.viewcode"]
exclude_patterns = ["_build", "_inventories"]
html_theme = "alabaster"
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}

# --- intersphinx: a local inventory or nothing --------------------------------------------------

_TWISTED_INV = os.environ.get("NSQTW_TWISTED_INVENTORY") or str(DOCS / "_inventories" / "twisted.inv")
intersphinx_mapping = (
    {"twisted": ("https://docs.twisted.org/en/stable/api/", _TWISTED_INV)} if os.path.exists(_TWISTED_INV) else {}
)
intersphinx_disabled_reftypes = ["*"]  # only explicit twisted: references go there

# --- guides: README.rst's sections, one page each ------------------------------------------------

def _slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def _rule(line: str) -> bool:
    return bool(line) and set(line) == {"="}


def readme_sections(text: str) -> tuple[str, list[tuple[str, str]]]:
    """(the introduction, [(title, body)]) of README.rst, cut at its ``====``-underlined section
    titles (the document title, which has an overline too, is not one)."""
    lines = text.split("\n")
    starts = [i for i in range(len(lines) - 1)
              if lines[i].strip() and not _rule(lines[i]) and _rule(lines[i + 1])
              and len(lines[i + 1]) >= len(lines[i].rstrip()) and not (i and _rule(lines[i - 1]))]
    intro = "\n".join(lines[:starts[0]]) if starts else text
    sections = []
    for n, i in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else len(lines)
        sections.append((lines[i].strip(), "\n".join(lines[i + 2:end])))
    return intro, sections


def write_guides(app: object = None) -> None:
    text = (ROOT / "README.rst").read_text(encoding="utf-8")
    _, sections = readme_sections(text)
    titles = {title: _slug(title) for title, _ in sections}
    out = DOCS / "guide"
    out.mkdir(exist_ok=True)
    for title, body in sections:
        body = body.replace(".. image:: docs/images/", ".. image:: /images/")
        for other, slug in titles.items():  # README's links between sections become links between pages
            body = body.replace(f"`{other}`_", f":doc:`{other} <{slug}>`")
        page = f".. generated from README.rst's \"{title}\" section; edit README.rst\n\n" \
               f"{title}\n{'=' * len(title)}\n{body}"
        path = out / f"{titles[title]}.rst"
        if not path.exists() or path.read_text(encoding="utf-8") != page:
            path.write_text(page, encoding="utf-8")
    index = "Guides\n======\n\nREADME.rst's sections, one page each.\n\n.. toctree::\n   :maxdepth: 1\n\n" + \
        "".join(f"   {titles[t]}\n" for t, _ in sections)
    path = out / "index.rst"
    if not path.exists() or path.read_text(encoding="utf-8") != index:
        path.write_text(index, encoding="utf-8")


write_guides()  # before Sphinx reads the sources
