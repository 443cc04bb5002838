"""``.. nsqtw-options:: nsqtw.options.NsqdOptions``: one row per option of an options class (or the
client's ``Config``), read from the fields themselves: the attribute, NSQ's flag (or go-nsq's option
name), the default as NSQ prints it, and the help text.  The tables cannot drift from the code."""

from __future__ import annotations

import importlib
import re
from typing import Any

import attr
from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective


def _load(path: str) -> Any:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _default(field: attr.Attribute[Any]) -> str:
    from nsqtw.options import display_default

    default = field.default
    if isinstance(default, attr.Factory):
        factory = default.factory
        if factory in (list, dict, tuple):
            value: Any = factory()
        else:
            return "computed at start"
    else:
        value = default
    if "flag" in field.metadata:
        return display_default(field, value)
    if value is None:
        return "none"
    return str(value)


#: a flag named in a help text, outside a literal: ``--log-level`` (smart quotes would make it "–log-level")
_FLAG = re.compile(r"(?<![\w`-])(--[a-z][a-z0-9]*(?:-[a-z0-9]+)*)")


def _cell(text: str) -> str:
    return text.replace("\n", " ").replace("|", "\\|") or " "


def _help(text: str) -> str:
    """A help text for a table cell, every flag it names as a literal (copied, it works in a shell)."""
    return _FLAG.sub(r"``\1``", _cell(text))


def _literal(text: str) -> str:
    """A default as an inline literal; an empty one, or one with spaces at its ends, quoted."""
    if not text or text != text.strip():
        text = f'"{text}"'
    return f"``{_cell(text)}``"


class OptionsTable(SphinxDirective):
    required_arguments = 1
    has_content = False

    def run(self) -> list[nodes.Node]:
        cls = _load(self.arguments[0])
        go_nsq = not any("flag" in f.metadata for f in attr.fields(cls))
        rows = [".. list-table::", "   :header-rows: 1", "   :widths: 22 26 14 38", "",
                "   * - attribute", f"     - {'go-nsq option' if go_nsq else 'flag'}", "     - default",
                "     - what it does"]
        for field in attr.fields(cls):
            meta = field.metadata
            if go_nsq:
                name = f"``{field.name}``"
                doc = meta.get("doc", "")
            else:
                name = f"``--{meta['flag']}``" if meta.get("flag") else "(no flag: embedding only)"
                doc = meta.get("help", "")
                if meta.get("unsupported"):
                    doc = f"{doc} (refused: {meta['unsupported']})"
            rows += [f"   * - ``{field.name}``", f"     - {name}", f"     - {_literal(_default(field))}",
                     f"     - {_help(doc)}"]
        container = nodes.container()
        self.state.nested_parse(StringList(rows, source=self.arguments[0]), self.content_offset, container)
        return container.children


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("nsqtw-options", OptionsTable)
    return {"parallel_read_safe": True}
