"""One-way layers: nsqtw's packages import downwards only, and no modules import each other in a
circle.  Read from the source (no module is imported), so a new upward import or circle fails here
with the file and line that made it.

The layers, bottom to top:

0. ``errors``, ``options``, ``protocol``, ``reactor``, ``turn``, ``seam``, ``golog``, ``spinreactor``, ``upstream`` and the package root
1. ``backend`` (where queued messages live)
2. ``nsqd``, ``lookupd`` (the sans-IO cores) and ``client``
3. ``tcp``, ``http``, ``stats``, ``admin`` (transport glue, the HTTP applications, the stats documents)
4. ``service`` (the composition roots: Twisted services wiring the layers below)
5. ``embed*``, ``tap``, ``cli``, ``process``, ``tools``, ``testing``, ``spark`` (entry points and
   applications; ``process`` is the daemons' process policy, which only entry points apply)

A package may use its own layer and the layers below; it reaches what sits above it through
a protocol declared beside it (e.g. ``http.nsqd_api.NsqdNode``, which the NsqdService provides).
Type-only imports (``if TYPE_CHECKING:``) count for the layers, not for the run-time circles.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "nsqtw"

LAYERS = {
    "nsqtw": 0, "nsqtw.errors": 0, "nsqtw.options": 0, "nsqtw.protocol": 0, "nsqtw.reactor": 0,
    "nsqtw.golog": 0, "nsqtw.spinreactor": 0, "nsqtw.upstream": 0, "nsqtw.turn": 0, "nsqtw.seam": 0,
    "nsqtw.backend": 1,
    "nsqtw.nsqd": 2, "nsqtw.lookupd": 2, "nsqtw.client": 2,
    "nsqtw.tcp": 3, "nsqtw.http": 3, "nsqtw.stats": 3, "nsqtw.admin": 3,
    "nsqtw.service": 4,
    "nsqtw.embed": 5, "nsqtw.embed_admin": 5, "nsqtw.embed_lookupd": 5, "nsqtw.tap": 5, "nsqtw.cli": 5,
    "nsqtw.process": 5,
    "nsqtw.tools": 5, "nsqtw.testing": 5, "nsqtw.spark": 5,
}

#: exceptions: none (admin's app takes an AdminNode protocol, spark's report no longer imports
#: stats); nothing may be added here without a reason
KNOWN_UPWARD: set[tuple[str, str]] = set()
KNOWN_CIRCLES: list[set[str]] = []


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, int, bool]]:
    """``(imported nsqtw module, line, type-only)`` for every import in the file, nested ones too."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, type_only: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, type_only)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    found.append((alias.name, node.lineno, type_only))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in modules:
                    found.append((sub, node.lineno, type_only))
                elif target in modules:
                    found.append((target, node.lineno, type_only))
        for child in ast.iter_child_nodes(node):
            visit(child, type_only)

    visit(ast.parse(path.read_text(), str(path)), False)
    return [(t, line, tc) for t, line, tc in found if t != name]


def _unit(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2])


def _graph() -> dict[str, list[tuple[str, int, bool]]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def test_every_package_has_a_layer() -> None:
    assert sorted({_unit(m) for m in _modules()} - set(LAYERS)) == []


def test_no_upward_imports() -> None:
    """A module imports its own layer or lower ones only (type-only imports included)."""
    upward = []
    for module, imports in _graph().items():
        for target, line, _ in imports:
            if LAYERS[_unit(target)] > LAYERS[_unit(module)] and (module, target) not in KNOWN_UPWARD:
                upward.append(f"{module}:{line} imports {target} (layer {LAYERS[_unit(target)]} > "
                              f"{LAYERS[_unit(module)]})")
    assert upward == []


def test_no_circles_between_packages() -> None:
    """Packages of one layer may use each other, but never both ways round (type-only imports included)."""
    edges: dict[str, dict[str, str]] = defaultdict(dict)
    for module, imports in _graph().items():
        for target, line, _ in imports:
            if _unit(module) != _unit(target) and (module, target) not in KNOWN_UPWARD:
                edges[_unit(module)].setdefault(_unit(target), f"{module}:{line}")
    both_ways = sorted(f"{a} <-> {b} ({edges[a][b]}, {edges[b][a]})"
                       for a in edges for b in edges[a] if a < b and a in edges.get(b, {}))
    assert both_ways == []


def test_no_import_circles_at_run_time() -> None:
    """No modules import each other in a circle when the program runs (Tarjan's strongly connected
    components of the run-time imports)."""
    graph = {m: sorted({t for t, _, type_only in imps if not type_only}) for m, imps in _graph().items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[set[str]] = []

    def strongconnect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, []):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(component)

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    assert [sorted(c) for c in circles if c not in KNOWN_CIRCLES] == []


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    """The reader finds imports inside functions and under TYPE_CHECKING (what the rules rely on)."""
    src = tmp_path / "m.py"
    src.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from nsqtw.service.nsqd import x\n"
                   "def f():\n    from nsqtw.tcp import nsqd\n")
    modules = {"nsqtw.service.nsqd": src, "nsqtw.tcp.nsqd": src, "nsqtw.tcp": src, "nsqtw.nsqd.m": src}
    assert sorted(_imports("nsqtw.nsqd.m", src, modules)) == [("nsqtw.service.nsqd", 3, True),
                                                              ("nsqtw.tcp.nsqd", 5, False)]
