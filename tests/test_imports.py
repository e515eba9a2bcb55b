"""Imports under ``kvviz/`` flow one way: no circle between files or packages, none up the layers.

Every import counts — module level, inside a function (a lazy import that closes a circle is still a
circle) and under ``TYPE_CHECKING``. The layer order is declared once, in docs/architecture.md
between ``<!-- layers -->`` and ``<!-- /layers -->`` (the base first: a unit imports only units on
earlier lines; units on one line sit side by side and do not import each other); this file reads it
from there. An import names the module that defines the name: no module re-exports another's
(a package's ``__init__`` may: it is the package's front).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"


# ---- walking the imports ---------------------------------------------------------------------------
def modules(root: Path) -> dict[str, Path]:
    """Dotted module name → file, for every ``.py`` under ``root/kvviz``."""
    out = {}
    for path in sorted((root / "kvviz").rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _base(name: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module a ``from … import`` names (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    parts = name.split(".")
    if path.name != "__init__.py":
        parts = parts[:-1]
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def imports(root: Path) -> dict[str, set[str]]:
    """Module → the kvviz modules it imports anywhere in its file. ``from pkg import sub`` imports the
    module ``pkg.sub``; ``from pkg import name`` imports ``pkg`` itself (its ``__init__``)."""
    mods = modules(root)
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name in mods)
            elif isinstance(node, ast.ImportFrom):
                base = _base(name, path, node)
                for a in node.names:
                    if f"{base}.{a.name}" in mods:
                        found.add(f"{base}.{a.name}")
                    elif base in mods:
                        found.add(base)
        found.discard(name)
        graph[name] = found
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (each holds at least one circle)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan; the graph is small enough for recursion
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def collapsed(graph: dict[str, set[str]], depth: int) -> dict[str, set[str]]:
    """The graph with every module below ``depth`` dotted parts folded into its package of that depth."""

    def unit(m: str) -> str:
        return ".".join(m.split(".")[:depth])

    out: dict[str, set[str]] = {}
    for a, targets in graph.items():
        out.setdefault(unit(a), set()).update(unit(b) for b in targets if unit(b) != unit(a))
    return out


def declared_layers(text: str) -> list[list[str]]:
    """The layer lines between ``<!-- layers -->`` and ``<!-- /layers -->``, the base first; each line's
    units are its backquoted names before any " — " note (``memory`` for ``kvviz/memory/``, ``limits`` for ``kvviz/limits.py``,
    ``__init__`` for ``kvviz/__init__.py``)."""
    match = re.search(r"<!-- layers -->(.*?)<!-- /layers -->", text, re.S)
    assert match, "docs/architecture.md has no <!-- layers --> … <!-- /layers --> block"
    lines = [re.findall(r"`([\w.]+)`", line.split("—")[0]) for line in match.group(1).splitlines()]
    return [line for line in lines if line]


def layer_errors(graph: dict[str, set[str]], layers: list[list[str]]) -> list[str]:
    """Every import between top-level units that does not go down the declared layers."""
    level = {u: i for i, line in enumerate(layers) for u in line}

    def unit(m: str) -> str:
        parts = m.split(".")
        return "__init__" if len(parts) == 1 else parts[1]

    errors = []
    for a, targets in sorted(graph.items()):
        for b in sorted(targets):
            ua, ub = unit(a), unit(b)
            if ua == ub:
                continue
            if ua not in level or ub not in level:
                errors.append(f"{a} → {b}: {ua if ua not in level else ub} is not in the layer list")
            elif level[ub] >= level[ua]:
                where = "beside" if level[ub] == level[ua] else "above"
                errors.append(f"{a} → {b}: {ub} is drawn {where} {ua}")
    return errors


def reexports(root: Path) -> list[str]:
    """``from X import n`` anywhere under kvviz/ where module X (not a package) only imported ``n``."""
    mods = modules(root)
    borrowed: dict[str, set[str]] = {}
    for name, path in mods.items():
        if path.name == "__init__.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        mine = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        for n in tree.body:
            if isinstance(n, (ast.Assign, ast.AnnAssign)):
                targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                mine.update(x.id for t in targets for x in ast.walk(t) if isinstance(x, ast.Name))
        borrowed[name] = {
            a.asname or a.name
            for n in tree.body
            if isinstance(n, ast.ImportFrom) and _base(name, path, n).startswith("kvviz")
            for a in n.names
            if (a.asname or a.name) not in mine
        }
    found = []
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = _base(name, path, node)
                for a in node.names:
                    if a.name in borrowed.get(base, ()):
                        found.append(f"{name}:{node.lineno} imports {a.name} from {base}, which only imports it")
    return found


# ---- the project -----------------------------------------------------------------------------------
GRAPH = imports(ROOT)


def test_no_circle_between_files():
    assert cycles(GRAPH) == [], "import circles between files (lazy and TYPE_CHECKING imports count)"


@pytest.mark.parametrize("depth", [2, 3])
def test_no_circle_between_packages(depth):
    assert cycles(collapsed(GRAPH, depth)) == []


def test_every_import_goes_down_the_declared_layers():
    layers = declared_layers(DOC.read_text(encoding="utf-8"))
    units = {u for line in layers for u in line}
    present = {
        p.stem if p.is_file() else p.name
        for p in (ROOT / "kvviz").iterdir()
        if p.suffix == ".py" or (p / "__init__.py").is_file()
    }
    assert units == present, f"layer list vs kvviz/: missing {sorted(present - units)}, extra {sorted(units - present)}"
    assert sum(map(len, layers)) == len(units), "a unit is listed twice"
    assert layer_errors(GRAPH, layers) == []


def test_no_module_re_exports_another():
    assert reexports(ROOT) == []


def test_the_notebook_import():
    import kvviz
    from kvviz.capture.loop import capture
    from kvviz.capture.trace import Trace  # loading a capture module keeps the name on the function
    from kvviz.models import load_model

    assert kvviz.capture is capture and kvviz.load_model is load_model and Trace


# ---- the checks catch what they name ---------------------------------------------------------------
def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in {"kvviz/__init__.py": "", **files}.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_a_lazy_import_that_closes_a_circle_is_found(tmp_path):
    root = _tree(
        tmp_path,
        {
            "kvviz/a/__init__.py": "",
            "kvviz/a/run.py": "from kvviz.a.compose import helper\n",
            "kvviz/a/compose.py": "def helper():\n    from kvviz.a import run\n",
            "kvviz/a/free.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from kvviz.a.run import x\n",
        },
    )
    assert cycles(imports(root)) == [["kvviz.a.compose", "kvviz.a.run"]]


def test_a_package_circle_and_an_import_up_the_layers_are_found(tmp_path):
    root = _tree(
        tmp_path,
        {
            "kvviz/low/__init__.py": "",
            "kvviz/low/config.py": "import kvviz.high.views\n",
            "kvviz/high/__init__.py": "",
            "kvviz/high/views.py": "from ..low import config\n",
            "kvviz/side.py": "from kvviz.low.config import x\n",
        },
    )
    graph = imports(root)
    assert cycles(graph) == [["kvviz.high.views", "kvviz.low.config"]]
    assert cycles(collapsed(graph, 2)) == [["kvviz.high", "kvviz.low"]]
    errors = layer_errors(graph, declared_layers("<!-- layers -->\n- `low` `side`\n- `high`\n<!-- /layers -->"))
    assert errors == [
        "kvviz.low.config → kvviz.high.views: high is drawn above low",
        "kvviz.side → kvviz.low.config: low is drawn beside side",
    ]


def test_a_re_export_is_found(tmp_path):
    root = _tree(
        tmp_path,
        {
            "kvviz/io.py": "def forward(): ...\n",
            "kvviz/loop.py": "from kvviz.io import forward\n",
            "kvviz/user.py": "def f():\n    from kvviz.loop import forward\n",
        },
    )
    assert reexports(root) == ["kvviz.user:2 imports forward from kvviz.loop, which only imports it"]
