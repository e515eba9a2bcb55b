"""`pip install .` gives a usable library: the wheel holds every kvviz module and data file, and installed on
its own (outside the repository) it runs the examples and a demo on the bundled model."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # builds a wheel and starts interpreters


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"  # build from a copy: setuptools writes build/ and *.egg-info beside the sources
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
            str(tmp / "dist"),
            str(src),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return next((tmp / "dist").glob("kvviz-*.whl"))


def test_wheel_holds_the_library_and_its_data(wheel):
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


INSTALLED_RUN = """
import json, sys
import kvviz
from kvviz.eviction.demos import sinks_demo
from kvviz.examples import examples
from kvviz.memory.layout import preset_names
from kvviz.models import load_model

ex = examples()
res = sinks_demo(load_model(), n_tokens=40, cache_size=16)
print(json.dumps({"file": kvviz.__file__, "examples": {k: len(v[0]) for k, v in ex.items()},
                  "presets": preset_names(), "perplexity": res.perplexity}))
"""


def test_the_installed_wheel_runs_the_examples_and_the_sinks_demo(wheel, tmp_path):
    target, cwd = tmp_path / "site", tmp_path / "elsewhere"
    cwd.mkdir()
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run(
        [sys.executable, "-c", INSTALLED_RUN],
        cwd=cwd,
        env={**env, "PYTHONPATH": str(target)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["file"].startswith(str(target)), "the installed copy ran, not the repository's"
    assert out["examples"]["The source chapter (long)"] > 10_000  # the chapter text shipped as package data
    assert "Llama-3-70B" in out["presets"]
    assert len(out["perplexity"]) == 3 and all(v > 1 for v in out["perplexity"].values())
