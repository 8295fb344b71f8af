"""The packages import in one direction: popxl_fx -> addons -> popxl_core (the "Layout"
section of docs/setup.md), use only the public names of the packages below them, and have no
import circle but the op recursion of the PopXL API (`_op_recursion`); the circles cut in
issue 23 stay cut.

Checked on the source (every ``import`` and ``from ... import`` statement, including those inside
functions), so a late import cannot hide a reversed dependency.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = {"popxl_core": {"addons", "popxl_fx"}, "addons": {"popxl_fx"}}


def _tree(path: Path) -> ast.Module:
    """The parsed source of ``path``; a source is parsed once per run (the checks only read
    the trees)."""
    return _parse(path.read_text(), str(path))


@functools.cache
def _parse(source: str, name: str) -> ast.Module:
    return ast.parse(source, name)


def _imported_packages(path: Path) -> set[tuple[str, int]]:
    """Top-level package names that ``path`` imports, each with the line of its import."""
    found = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            found |= {(a.name.split(".")[0], node.lineno) for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add((node.module.split(".")[0], node.lineno))
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_does_not_import_the_layers_above_it(package):
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in sorted((ROOT / package).rglob("*.py"))
        for name, line in sorted(_imported_packages(path))
        if name in FORBIDDEN[package]
    ]
    assert not wrong, "\n".join(wrong)


def test_the_check_sees_an_import_inside_a_function(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("def f():\n    import popxl_fx.api\n")
    assert ("popxl_fx", 2) in _imported_packages(source)


# --- import circles ------------------------------------------------------------------------
# Modules whose import circles were cut (issue 23): none of them may be part of a circle again.
# An import under ``if TYPE_CHECKING:`` does not run, so it makes no circle.
CUT = (
    "popxl_fx.lowering",
    "popxl_fx.fallback",
    "popxl_core.sim.report",
    "popxl_core.sim.report_diff",
    "popxl_core.sim.plan",
    "addons.graph",
    "addons.transforms.autodiff",
    "popxl_core.transforms.merge_exchange",
)
PACKAGES = ("popxl_core", "addons", "popxl_fx")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _runtime_nodes(tree: ast.AST, skip_functions: bool = False):
    """Every node of ``tree`` outside ``if TYPE_CHECKING:`` blocks (and outside function
    bodies with ``skip_functions``)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if skip_functions and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            test = getattr(child, "test", None)
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(test):
                stack.extend(child.orelse)
                continue
            stack.append(child)


def _import_time_nodes(tree: ast.AST):
    """The nodes of ``tree`` that run when the module is imported (a function's own imports
    run when it is called)."""
    return _runtime_nodes(tree, skip_functions=True)


def _imports(name: str, path: Path, modules: dict[str, Path], nodes=_runtime_nodes) -> set[str]:
    """The project modules that module ``name`` imports (at any depth of its code, or only
    those ``nodes`` yields)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in nodes(_tree(path)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            target = node.module if node.level == 0 else ".".join(base + [node.module or ""])
            target = target.rstrip(".")
            for alias in node.names:
                full = f"{target}.{alias.name}"
                found.add(full if full in modules else target)
    return (found & modules.keys()) - {name}


@functools.cache
def _import_graph(nodes=_runtime_nodes) -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules, nodes) for name, path in modules.items()}


def _reaches(graph: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, stack = set(), [start]
    while stack:
        for nxt in graph[stack.pop()] - seen:
            if nxt == goal:
                return True
            seen.add(nxt)
            stack.append(nxt)
    return False


def _circles_through(graph: dict[str, set[str]], name: str) -> list[str]:
    """The modules ``name`` imports that import ``name`` back (directly or not)."""
    return sorted(m for m in graph[name] if m == name or _reaches(graph, m, name))


@pytest.mark.parametrize("name", CUT)
def test_no_import_circle_through(name):
    graph = _import_graph()
    assert name in graph, f"{name} moved: update CUT"
    assert not _circles_through(graph, name), f"{name} is in an import circle"


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph``: its strongly connected parts of 2 or more modules
    (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = stack[stack.index(v) :]
            del stack[stack.index(v) :]
            if len(part) > 1:
                found.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _op_recursion(importer: str, imported: str) -> bool:
    """The late imports (inside functions) that the PopXL API's own recursion needs: a
    `Tensor`'s operators are ops and ops make Tensors (``tensor``, ``tensor_methods``), a
    gradient is built of ops (``transforms.autodiff``), and an op's helper calls other ops
    (between modules of ``ops``). These are the only import circles allowed in the three
    packages."""
    in_ops = lambda m: m == "popxl_core.ops" or m.startswith("popxl_core.ops.")
    callers = {"popxl_core.tensor", "popxl_core.tensor_methods", "popxl_core.transforms.autodiff"}
    return in_ops(imported) and (in_ops(importer) or importer in callers)


def test_no_import_circle_at_import_time():
    """The module-level imports of popxl_core, addons and popxl_fx form no circle at all."""
    assert _circles(_import_graph(_import_time_nodes)) == []


def test_no_import_circle_but_the_op_recursion():
    """With the imports inside functions too, the only circles are `_op_recursion`'s: cut
    those late imports and none is left (popxl_fx's explain <-> pipeline <-> program and
    phased <-> steps were the last others; `stage` and `built` hold what both sides read)."""
    full, top = _import_graph(), _import_graph(_import_time_nodes)
    graph = {
        name: {m for m in imported if m in top[name] or not _op_recursion(name, m)}
        for name, imported in full.items()
    }
    assert _circles(graph) == []


def test_the_circle_check_sees_a_circle_made_by_a_late_import(tmp_path):
    (tmp_path / "pkg").mkdir()
    a, b = tmp_path / "pkg" / "a.py", tmp_path / "pkg" / "b.py"
    a.write_text("def f():\n    from . import b\n")
    b.write_text("from . import a\n")
    modules = {"pkg.a": a, "pkg.b": b}
    late = {n: _imports(n, p, modules) for n, p in modules.items()}
    top = {n: _imports(n, p, modules, _import_time_nodes) for n, p in modules.items()}
    assert _circles(late) == [["pkg.a", "pkg.b"]] and _circles(top) == []
    assert _circles({"x": {"y"}, "y": set(), "z": {"z"}}) == []  # a self-import is no circle


def test_merge_exchange_does_not_import_the_simulator():
    graph = _import_graph()
    assert not [m for m in graph["popxl_core.transforms.merge_exchange"] if ".sim" in m]


def test_the_circle_check_sees_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circles_through(graph, "a") == ["b"] and not _circles_through(graph, "d")


def test_the_import_graph_skips_type_checking_imports(tmp_path):
    (tmp_path / "pkg").mkdir()
    source = tmp_path / "pkg" / "m.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import n\n")
    modules = {"pkg.m": source, "pkg.n": tmp_path / "pkg" / "n.py"}
    assert _imports("pkg.m", source, modules) == set()
    source.write_text("def f():\n    from . import n\n")
    assert _imports("pkg.m", source, modules) == {"pkg.n"}


# --- private names across packages ---------------------------------------------------------
LOWER = {"addons": ("popxl_core",), "popxl_fx": ("popxl_core", "addons")}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


@functools.cache
def _private_names(package: str) -> set[str]:
    """Private names a package defines: functions, classes, module-level names, attributes
    it assigns (``self._x = ...``) and its private modules."""
    names = set()
    for path in (ROOT / package).rglob("*.py"):
        names.add(path.stem)
        for node in ast.walk(_tree(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return {n for n in names if _private(n)}


def _root(node: ast.expr) -> ast.expr:
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node


def _third_party_names(tree: ast.AST) -> set[str]:
    """Names a file binds to modules outside the project (``torch`` in ``torch._ops``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {
                (a.asname or a.name).split(".")[0]
                for a in node.names
                if a.name.split(".")[0] not in PACKAGES
            }
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] not in PACKAGES:
                names |= {a.asname or a.name for a in node.names}
    return names


def _private_reach(
    path: Path, lower: set[str], packages: tuple[str, ...], own: frozenset[str] = frozenset()
) -> list[str]:
    """Where ``path`` uses a private name of the packages below it: ``from lower import _x``,
    a private module of theirs, ``obj._x`` for an ``_x`` they define (third-party modules
    such as ``torch._ops`` excepted), and ``self._x`` / ``super()._x`` for an ``_x`` that its
    own package (``own``) never defines: a subclass reaching into its base class."""
    tree = _tree(path)
    outside = _third_party_names(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] in packages:
                names = [*node.module.split("."), *(a.name for a in node.names)]
                found += [f"{node.lineno}: import of {n}" for n in names if _private(n)]
        elif isinstance(node, ast.Attribute) and _private(node.attr) and node.attr in lower:
            root = _root(node.value)
            if isinstance(root, ast.Name) and root.id in outside:
                continue
            if isinstance(root, ast.Name) and root.id in {"self", "cls", "super"}:
                if node.attr in own:
                    continue
            found.append(f"{node.lineno}: .{node.attr}")
    return found


@pytest.mark.parametrize("package", sorted(LOWER))
def test_no_private_names_of_the_packages_below(package):
    lower = set().union(*(_private_names(p) for p in LOWER[package]))
    own = frozenset(_private_names(package))
    wrong = [
        f"{path.relative_to(ROOT)}:{where}"
        for path in sorted((ROOT / package).rglob("*.py"))
        for where in _private_reach(path, lower, LOWER[package], own)
    ]
    assert not wrong, "\n".join(wrong)


def test_the_private_check_sees_a_reach(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        "import torch\nfrom popxl_core.ops._utils import rand\n"
        "def f(g):\n    return g._ops, self._ops, torch._ops, self._vars\n"
    )
    found = _private_reach(source, {"_ops", "_vars"}, ("popxl_core",), frozenset({"_ops"}))
    assert found == ["2: import of _utils", "4: ._ops", "4: ._vars"]
