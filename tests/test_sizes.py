"""Files under ``kvviz/`` stay at most 400 lines and functions at most 120, so each still has one job.

A longer function says why in its docstring, on a line of its own that starts with ``Length:``. The
files and functions over the limits today are listed below with their current size, as a ceiling:
a new one fails, a listed one that grows fails, and one that shrinks under the limit must leave the
list (the message says so), so the list only gets shorter.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 120
REASON = re.compile(r"^\s*Length: \S", re.M)

# a file or function listed here may stay at its size (and no larger) until it is split
ALLOWED: dict[str, int] = {}


def sizes(root: Path) -> dict[str, int]:
    """``path`` → lines and ``path::function`` → lines for each file and function over the limits
    (a function whose docstring gives a ``Length:`` reason is not over)."""
    out = {}
    for path in sorted((root / "kvviz").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        text = path.read_text(encoding="utf-8")
        if (n := len(text.splitlines())) > MAX_FILE_LINES:
            out[rel] = n
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES and not REASON.search(ast.get_docstring(node) or ""):
                    out[f"{rel}::{node.name}"] = n
    return out


def problems(found: dict[str, int], allowed: dict[str, int]) -> list[str]:
    """What breaks the rule: a new oversize file or function, a listed one grown past its ceiling, a
    listed one now within the limits (to be removed from the list)."""
    out = [
        f"{k}: {n} lines (limit {MAX_FILE_LINES if '::' not in k else MAX_FUNCTION_LINES})"
        for k, n in found.items()
        if k not in allowed
    ]
    out += [
        f"{k}: grew to {found[k]} lines (listed at {allowed[k]})"
        for k in found
        if k in allowed and found[k] > allowed[k]
    ]
    out += [
        f"{k}: now within the limit; remove it from the list in tests/test_sizes.py" for k in allowed if k not in found
    ]
    return out


def test_files_and_functions_stay_within_the_limits():
    assert problems(sizes(ROOT), ALLOWED) == []


def test_the_check_finds_a_long_file_and_function_and_accepts_a_reason(tmp_path):
    pkg = tmp_path / "kvviz"
    pkg.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (pkg / "long.py").write_text(f"def long():\n{body}\n" + "\n" * (MAX_FILE_LINES - MAX_FUNCTION_LINES))
    (pkg / "why.py").write_text(
        f'def why():\n    """Builds a page.\n\n    Length: one layout, read top to bottom.\n    """\n{body}\n'
    )
    found = sizes(tmp_path)
    assert found == {"kvviz/long.py": MAX_FILE_LINES + 1, "kvviz/long.py::long": MAX_FUNCTION_LINES + 1}
    assert problems(found, {"kvviz/long.py": MAX_FILE_LINES + 1}) == [
        f"kvviz/long.py::long: {MAX_FUNCTION_LINES + 1} lines (limit {MAX_FUNCTION_LINES})"
    ]
    assert problems(found, {**found, "kvviz/gone.py": 500}) == [
        "kvviz/gone.py: now within the limit; remove it from the list in tests/test_sizes.py"
    ]
    assert problems(found, {**found, "kvviz/long.py": MAX_FILE_LINES}) == [
        f"kvviz/long.py: grew to {MAX_FILE_LINES + 1} lines (listed at {MAX_FILE_LINES})"
    ]


MAX_BUILD_LINES = 80  # a tab's or section's build: its layout plus the wiring, no handler bodies


def long_builds(root: Path) -> dict[str, int]:
    """``path::build`` → lines for every module-level ``build`` under ``kvviz/ui`` over :data:`MAX_BUILD_LINES`."""
    out = {}
    for path in sorted((root / "kvviz" / "ui").rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            n = node.end_lineno - node.lineno + 1 if isinstance(node, ast.FunctionDef) else 0
            if getattr(node, "name", "") == "build" and n > MAX_BUILD_LINES:
                out[f"{path.relative_to(root).as_posix()}::build"] = n
    return out


def test_every_tab_build_is_its_layout_and_one_wiring():
    assert long_builds(ROOT) == {}


def test_the_build_check_finds_a_long_build(tmp_path):
    ui = tmp_path / "kvviz" / "ui"
    ui.mkdir(parents=True)
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_BUILD_LINES))
    (ui / "tab.py").write_text(f"def build(ctx):\n{body}\n")
    assert long_builds(tmp_path) == {"kvviz/ui/tab.py::build": MAX_BUILD_LINES + 1}
