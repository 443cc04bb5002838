"""The checks ``make docs`` runs on the built site (``python docs/check_site.py docs/_build/html``).

Three things Sphinx's own ``-W`` does not catch:

* **flags**: no flag name after an en dash.  reStructuredText's smart quotes turn ``--flag`` written
  as plain text into "–flag", which fails when copied into a shell; a flag belongs in a literal.
* **public API**: every name a public module exports (``__all__``), and every public method and
  property of the classes among them, has a docstring of its own and an entry in the built
  reference (``objects.inv``), and so has every public attribute the testing fixtures set in
  ``__init__``; every option of the options classes (flag or not) is in the options page.
* **HTTP API**: every route of nsqd, nsqlookupd and nsqadmin (read from their klein apps' source) is
  named in the HTTP API reference, written as NSQ's docs write it (``/config/:opt``).

Each problem is printed on its own line; the exit status is 1 when there is any.
"""

from __future__ import annotations

import ast
import html
import importlib
import inspect
import re
import sys
import zlib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: the public face (tests/test_public_api.py pins what each exports)
PUBLIC_MODULES = ("nsqtw.embed", "nsqtw.client", "nsqtw.testing", "nsqtw.testing.pytest_plugin",
                  "nsqtw.options", "nsqtw.errors")
OPTIONS_CLASSES = ("nsqtw.options.NsqdOptions", "nsqtw.embed.LookupdOptions", "nsqtw.embed.AdminOptions")
#: the HTTP apps and the page of the built site that must name each of their routes
ROUTE_SOURCES = ("nsqtw/nsqd/http.py", "nsqtw/lookupd/http.py", "nsqtw/admin/app.py")
HTTP_PAGE = "guide/http-api.html"

EN_DASH = re.compile(r"(?:\u2013|&#8211;|&ndash;)([a-z][a-z0-9]*(?:-[a-z0-9]+)*)")
HYPHENATED = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)+\Z")
TAG = re.compile(r"<[^>]+>")


def _load(path: str) -> Any:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _flags() -> set[str]:
    import attr

    names: set[str] = set()
    for path in OPTIONS_CLASSES:
        for field in attr.fields(_load(path)):
            if field.metadata.get("flag"):
                names.add(field.metadata["flag"])
    return names


def check_flags(site: Path) -> list[str]:
    """No known flag (or hyphenated word) right after an en dash anywhere in the site's text."""
    flags = _flags()
    problems = []
    for page in sorted(site.rglob("*.html")):
        text = page.read_text(encoding="utf-8")
        if "_sources" in page.parts or "_modules" in page.parts:
            continue
        for m in EN_DASH.finditer(text):
            word = m.group(1)
            if word in flags or HYPHENATED.match(word):
                problems.append(f"{page.relative_to(site)}: en dash before a flag: '\u2013{word}' "
                                f"(write ``--{word}`` as a literal)")
    return problems


def _inventory(site: Path) -> set[str]:
    """The object names of the built site's ``objects.inv``."""
    data = (site / "objects.inv").read_bytes()
    lines = data.split(b"\n", 4)
    body = zlib.decompress(lines[4]).decode("utf-8")
    names = set()
    for line in body.splitlines():
        name, _, rest = line.partition(" ")
        if rest.startswith("py:"):
            names.add(name)
    return names


def _documented(inventory: set[str], qualname: str) -> bool:
    """Whether ``Class.member`` (or ``name``) is in the reference under any module path."""
    return any(n == qualname or n.endswith("." + qualname) for n in inventory)


def _own_members(cls: type) -> list[tuple[str, Any]]:
    out = []
    for name, value in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if inspect.isfunction(value) or isinstance(value, property):
            out.append((name, value))
    return out


def _instance_attributes(cls: type) -> list[str]:
    """The public attributes ``__init__`` assigns (``self.name = ...``), read from its source."""
    init = cls.__dict__.get("__init__")
    if not inspect.isfunction(init):
        return []
    try:
        tree = ast.parse(inspect.cleandoc("\n" + inspect.getsource(init)))
    except (OSError, TypeError, SyntaxError):
        return []
    names = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if (isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
                        and not t.attr.startswith("_") and t.attr not in names):
                    names.append(t.attr)
    return names


def check_public_api(site: Path) -> list[str]:
    """Every exported name and every public method/property of exported classes: a docstring of its
    own and an entry in the reference."""
    inventory = _inventory(site)
    problems = []
    seen: set[int] = set()
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name)
            if inspect.isclass(obj) or inspect.isfunction(obj):
                if id(obj) in seen:
                    continue
                seen.add(id(obj))
                own_doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__
                if not (own_doc or "").strip():
                    problems.append(f"{module_name}.{name}: no docstring")
                if not _documented(inventory, obj.__name__):
                    problems.append(f"{module_name}.{name}: not in the API reference")
            if inspect.isclass(obj):
                for member, value in _own_members(obj):
                    doc = value.__doc__ if not isinstance(value, property) else (value.fget.__doc__ if value.fget else None)
                    if not (doc or "").strip():
                        problems.append(f"{module_name}.{name}.{member}: no docstring")
                    elif not _documented(inventory, f"{obj.__name__}.{member}"):
                        problems.append(f"{module_name}.{name}.{member}: not in the API reference")
                if module_name.startswith("nsqtw.testing"):  # the fixtures' attributes are their API
                    for attribute in _instance_attributes(obj):
                        if not _documented(inventory, f"{obj.__name__}.{attribute}"):
                            problems.append(f"{module_name}.{name}.{attribute}: attribute not in the API reference")
    import attr

    options_page = TAG.sub(" ", (site / "api" / "options.html").read_text(encoding="utf-8"))
    for path in OPTIONS_CLASSES:
        for field in attr.fields(_load(path)):
            if field.name not in options_page:
                problems.append(f"{path}.{field.name}: not in the options reference (api/options.html)")
    return problems


def routes(source: Path) -> list[str]:
    """The paths of a klein app's ``@app.route(...)`` decorators, as NSQ's docs write them."""
    tree = ast.parse(source.read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "route"
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            path = re.sub(r"<(?:[a-z]+:)?([a-z_]+)>", r":\1", node.args[0].value)
            out.append(path)
    return out


def check_http_reference(site: Path) -> list[str]:
    page = site / HTTP_PAGE
    if not page.exists():
        return [f"{HTTP_PAGE}: missing (the HTTP API reference)"]
    text = html.unescape(TAG.sub(" ", page.read_text(encoding="utf-8")))
    problems = []
    for source in ROUTE_SOURCES:
        for path in routes(ROOT / source):
            # a path is named when it appears whole: not followed by more of a path
            if not re.search(re.escape(path) + r"(?![\w/:-])", text):
                problems.append(f"{HTTP_PAGE}: {source}'s route {path} is not named")
    return problems


def main(argv: list[str]) -> int:
    site = Path(argv[1] if len(argv) > 1 else ROOT / "docs" / "_build" / "html")
    problems = check_flags(site) + check_public_api(site) + check_http_reference(site)
    for p in problems:
        print(p)
    print(f"check_site: {len(problems)} problem(s)" if problems else "check_site: flags, public API and HTTP reference OK")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
