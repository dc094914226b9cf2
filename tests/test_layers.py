"""The package map in kvlayout/__init__.py's docstring is true: every module is listed once, in one
of three layers (core, adapters, tools); no module imports a later layer; no import cycles.

Imports are read from the source (ast), inside functions too (a lazy import is still a
dependency), except those under ``if TYPE_CHECKING:``. ``backends/cuda`` and ``backends/pallas``
are the package's ``kvlayout.backends.cuda`` and ``.pallas`` (pyproject.toml's package-dir).
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import kvlayout

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("core", "adapters", "tools")


@functools.cache
def _files() -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, is a package ``__init__``)."""
    out: dict[str, tuple[Path, bool]] = {}
    trees = [(ROOT / "kvlayout", "kvlayout")]
    trees += [(ROOT / "backends" / b, f"kvlayout.backends.{b}") for b in ("cuda", "pallas")]
    for folder, prefix in trees:
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            pkg = parts[-1] == "__init__"
            name = ".".join([prefix, *(parts[:-1] if pkg else parts)])
            out[name] = (path, pkg)
    return out


@functools.cache
def _imports() -> dict[str, set[str]]:
    """Module -> the kvlayout modules it imports (at module level or in a function)."""
    files = _files()
    edges: dict[str, set[str]] = {}
    for name, (path, pkg) in files.items():
        tree = ast.parse(path.read_text(), str(path))
        typing_only = {
            id(node)
            for branch in ast.walk(tree)
            if isinstance(branch, ast.If) and "TYPE_CHECKING" in ast.unparse(branch.test)
            for node in ast.walk(branch)
        }
        deps: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name in files)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    here = name.split(".") if pkg else name.split(".")[:-1]
                    here = here[: len(here) - node.level + 1]
                    base = ".".join(here + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    if sub in files:
                        deps.add(sub)
                    elif base in files:
                        deps.add(base)
        deps.discard(name)
        edges[name] = deps
    return edges


def _documented_layers() -> dict[str, str]:
    """Top-level module -> its layer, as the docstring's map lists them."""
    out: dict[str, str] = {}
    layer = None
    for line in (kvlayout.__doc__ or "").splitlines():
        head = re.match(r"^(\w+): ", line)
        if head and head[1] in LAYERS:
            layer = head[1]
            continue
        entry = re.match(r"^    ``(\w+)``\s", line)
        if entry and layer is not None:
            assert entry[1] not in out, f"{entry[1]} is listed twice in the map"
            out[entry[1]] = layer
    return out


def _top(module: str) -> str:
    """``kvlayout.viz.maps`` -> ``viz``; the package itself -> ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_module_is_on_the_map() -> None:
    layers = _documented_layers()
    assert set(layers.values()) == set(LAYERS)
    present = {_top(m) for m in _files()} - {""}
    assert sorted(present - set(layers)) == [], "add it to the map in kvlayout/__init__.py's docstring"
    assert sorted(set(layers) - present) == [], "the map lists a module that does not exist"


def test_no_module_imports_a_later_layer() -> None:
    layers = _documented_layers()
    rank = {m: LAYERS.index(layer) for m, layer in layers.items()}
    wrong = [
        f"{m} ({layers[_top(m)]}) imports {d} ({layers[_top(d)]})"
        for m, deps in _imports().items()
        if _top(m) in rank
        for d in sorted(deps)
        if _top(d) in rank and rank[_top(d)] > rank[_top(m)]
    ]
    assert wrong == []


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_no_import_cycles() -> None:
    assert _cycles(_imports()) == []


def test_the_checks_see_what_they_check() -> None:
    """The scanner finds known edges (lazy ones too) and the cycle finder finds a planted cycle."""
    edges = _imports()
    assert "kvlayout.validate" in edges["kvlayout.table"]
    assert "kvlayout.viz.common" in edges["kvlayout.viz.maps"]
    assert "kvlayout.verify" in edges["kvlayout.viz.maps"]  # imported inside table_map
    assert "kvlayout.table" in edges["kvlayout.backends.cuda.zeroer"]
    planted = {**edges, "kvlayout.validate": edges["kvlayout.validate"] | {"kvlayout.table"}}
    assert _cycles(planted) == [["kvlayout.table", "kvlayout.validate"]]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
