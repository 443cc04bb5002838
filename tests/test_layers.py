"""One-way layers: nsqtw is laid out by component (``nsqd``, ``lookupd``, ``admin``), each one package
holding its sans-IO core, its glue, its service, its twistd plugin and its embedding, on shared runtime
and codecs; imports point downwards only, and no modules import each other in a circle.  Read from the
source (no module is imported), so a new upward import or circle fails here with the file and line that
made it.

The floors, bottom to top:

0. ``errors``, ``options``, ``protocol`` (shared codecs) and the package root
1. ``runtime`` (shared runtime: reactor resolution, spin reactor, turn batcher, socket seam, process
   policy, listening, Go-style flags and logging, TLS, HTTP responses, the upstream HTTP client)
2. ``backend`` (where queued messages live)
3. the components ``nsqd``, ``lookupd``, ``admin``, and ``client``, ``spark``
4. ``allinone``, ``embed`` (the public face), ``cli``, ``tools``, ``testing`` (above every component)

Inside a component the same rule holds, per module (``COMPONENT_RANKS``):
``core`` (sans-IO) < glue (TCP, HTTP, stats, peers) < ``service`` < ``tap`` (twistd plugin) and ``embed``.
A component may use another component's ``core`` (nsqd speaks nsqlookupd's protocol V1 to its peers),
never its glue, service or plugin; components never use each other both ways round.
``runtime.process`` (the daemons' process policy) is applied by entry points only: the twistd plugins
and the CLI.

A module reaches what sits above it through a protocol declared beside it (e.g.
``nsqd.http.NsqdNode``, which the NsqdService provides).
Type-only imports (``if TYPE_CHECKING:``) count for the layers, not for the run-time circles.
"""

from __future__ import annotations

import ast
import functools
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "nsqtw"

LAYERS = {
    "nsqtw": 0, "nsqtw.errors": 0, "nsqtw.options": 0, "nsqtw.protocol": 0,
    "nsqtw.runtime": 1,
    "nsqtw.backend": 2,
    "nsqtw.nsqd": 3, "nsqtw.lookupd": 3, "nsqtw.admin": 3, "nsqtw.client": 3, "nsqtw.spark": 3,
    "nsqtw.allinone": 4, "nsqtw.embed": 4, "nsqtw.cli": 4, "nsqtw.tools": 4, "nsqtw.testing": 4,
}

#: the daemons' packages, and the rank of each module inside one (the first dotted name below the
#: component); a module not named here is glue (rank 1)
COMPONENTS = ("nsqtw.nsqd", "nsqtw.lookupd", "nsqtw.admin")
COMPONENT_RANKS = {"core": 0, "options": 0, "service": 2, "tap": 3, "embed": 3}
GLUE = 1

#: who may apply the daemons' process policy
PROCESS_POLICY = "nsqtw.runtime.process"
ENTRY_POINTS = ("nsqtw.nsqd.tap", "nsqtw.lookupd.tap", "nsqtw.admin.tap", "nsqtw.allinone.tap", "nsqtw.cli")

#: exceptions: none; nothing may be added here without a reason
KNOWN_UPWARD: set[tuple[str, str]] = set()
KNOWN_CIRCLES: list[set[str]] = []


@functools.cache
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


@functools.cache
def _graph() -> dict[str, list[tuple[str, int, bool]]]:
    """Every module's imports, parsed once per test run (the tests only read it)."""
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


def _component_rank(module: str) -> tuple[str, int] | None:
    """``(component, rank)`` of a module inside a daemon's package, or None outside them."""
    for component in COMPONENTS:
        if module.startswith(component + "."):
            return component, COMPONENT_RANKS.get(module[len(component) + 1:].split(".")[0], GLUE)
    return None


def test_inside_a_component_core_glue_service_plugin() -> None:
    """core < glue < service < tap/embed inside each component (type-only imports included); a
    component uses another one's core only."""
    wrong = []
    for module, imports in _graph().items():
        here = _component_rank(module)
        for target, line, _ in imports:
            there = _component_rank(target)
            if here is None or there is None:
                continue
            if here[0] == there[0] and there[1] > here[1]:
                wrong.append(f"{module}:{line} imports {target} (rank {there[1]} > {here[1]} in {here[0]})")
            elif here[0] != there[0] and there[1] != 0:
                wrong.append(f"{module}:{line} imports {target}: another component's non-core module")
    assert wrong == []


def test_the_sans_io_cores_import_only_codecs() -> None:
    """A component's core imports its own core, the shared codecs (errors, options, protocol, backend)
    and the package root: no runtime, glue or Twisted transport code."""
    allowed = ("nsqtw.errors", "nsqtw.options", "nsqtw.protocol", "nsqtw.backend")
    wrong = []
    for module, imports in _graph().items():
        here = _component_rank(module)
        if here is None or here[1] != 0:
            continue
        for target, line, _ in imports:
            there = _component_rank(target)
            if target == "nsqtw" or target.startswith(allowed) or (there is not None and there[1] == 0):
                continue
            wrong.append(f"{module}:{line} imports {target}")
    assert wrong == []


def test_process_policy_is_applied_by_entry_points_only() -> None:
    """Library code sets no process-wide state: only the twistd plugins and the CLI import the policy."""
    users = sorted({module for module, imports in _graph().items()
                    for target, _, _ in imports if target == PROCESS_POLICY})
    assert users and set(users) <= set(ENTRY_POINTS), users


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
    src.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from nsqtw.nsqd.service import x\n"
                   "def f():\n    from nsqtw.nsqd import tcp\n")
    modules = {"nsqtw.nsqd.service": src, "nsqtw.nsqd.tcp": src, "nsqtw.nsqd": src, "nsqtw.nsqd.core.m": src}
    assert sorted(_imports("nsqtw.nsqd.core.m", src, modules)) == [("nsqtw.nsqd.service", 3, True),
                                                                   ("nsqtw.nsqd.tcp", 5, False)]
    assert _component_rank("nsqtw.nsqd.core.m") == ("nsqtw.nsqd", 0)
    assert _component_rank("nsqtw.nsqd.service") == ("nsqtw.nsqd", 2)
    assert _component_rank("nsqtw.nsqd.tcp") == ("nsqtw.nsqd", GLUE)


#: the functions that may change the process's environment variables: run by entry points only
ENV_WRITERS = {("nsqtw.spark.cli", "entry_environment")}


@functools.cache
def _trees() -> dict[str, ast.Module]:
    return {name: ast.parse(path.read_text(), str(path)) for name, path in _modules().items()}


def _environment_writes(tree: ast.Module) -> list[tuple[str, int]]:
    """``(enclosing function, line)`` of every change to ``os.environ`` (item assignment or
    deletion, a mutating method) and every ``os.putenv``/``os.unsetenv`` call."""
    def is_environ(node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "environ" or (
            isinstance(node, ast.Name) and node.id == "environ")

    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, function: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name
        hit = False
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            hit = any(isinstance(t, ast.Subscript) and is_environ(t.value) for t in targets)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            func = node.func
            hit = (is_environ(func.value) and func.attr in ("setdefault", "update", "pop", "popitem", "clear",
                                                             "__setitem__", "__delitem__")) or (
                func.attr in ("putenv", "unsetenv") and isinstance(func.value, ast.Name) and func.value.id == "os")
        if hit:
            found.append((function, node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(tree, "<module>")
    return found


def test_library_code_sets_no_environment_variables() -> None:
    """Only the entry points' helpers (``ENV_WRITERS``) change ``os.environ``: embedding nsqtw (or
    calling its Spark jobs from a program) leaves the host's environment as it was."""
    wrong = [f"{module}:{line} in {function}" for module, tree in _trees().items()
             for function, line in _environment_writes(tree) if (module, function) not in ENV_WRITERS]
    assert wrong == []


def test_the_environment_check_sees_each_way_of_writing() -> None:
    tree = ast.parse("import os\nfrom os import environ\nos.environ['A'] = '1'\ndef f():\n"
                     "    os.environ.setdefault('B', '2')\n    environ.update(C='3')\n    del os.environ['A']\n"
                     "    os.putenv('D', '4')\n    x = os.environ.get('E')\n")
    assert _environment_writes(tree) == [("<module>", 3), ("f", 5), ("f", 6), ("f", 7), ("f", 8)]
