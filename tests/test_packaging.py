"""`pip install .` gives a usable library: the wheel holds every kvviz module and every data file beside them."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_holds_the_library_and_its_data(tmp_path):
    src = tmp_path / "src"  # build from a copy: setuptools writes build/ and *.egg-info beside the sources
    shutil.copytree(ROOT / "kvviz", src / "kvviz", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "requirements.txt"):
        shutil.copy(ROOT / name, src / name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path / "dist"),
            str(src),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    wheel = next((tmp_path / "dist").glob("kvviz-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "kvviz").rglob("*.py")}
    data = {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "kvviz").rglob("*")
        if p.is_file() and p.suffix not in {".py", ".pyc"}
    }
    assert any(n.endswith(".json") for n in data) and any(n.endswith(".txt") for n in data) and modules
    assert modules <= names, f"missing modules: {sorted(modules - names)}"
    assert data <= names, f"missing data files: {sorted(data - names)}"
    assert not any(n.startswith(("tests/", "bench/", "tools/")) for n in names)
