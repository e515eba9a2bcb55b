"""What a Space installs: a torch range ZeroGPU and a dedicated GPU Space both accept (and that holds the torch
``make`` installs), a ``python_version`` ZeroGPU offers, gradio with its MCP extra, and never ``spaces``."""

from __future__ import annotations

import re
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
# huggingface/hub-docs docs/hub/spaces-zerogpu.md, "Supported Versions" (August 2026): ZeroGPU installs one of
# these torch builds, the one matching requirements.txt, and runs one of these Pythons
ZEROGPU_TORCH = ["2.8.0", "2.9.1", "2.10.0", "2.11.0"]
ZEROGPU_PYTHON = ["3.12.12", "3.10.13"]


def requirements() -> dict[str, Requirement]:
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    reqs = [Requirement(line) for line in lines if line.strip() and not line.lstrip().startswith("#")]
    return {r.name: r for r in reqs}


def header() -> dict[str, str]:
    block = re.match(r"^---\n(.*?)\n---\n", (ROOT / "README.md").read_text(), re.S)
    assert block, "README.md must start with the Space metadata block"
    pairs = (line.split(":", 1) for line in block.group(1).splitlines() if ":" in line)
    return {k.strip(): v.strip().strip("\"'") for k, v in pairs}


def test_the_torch_range_holds_a_zerogpu_build_and_the_one_make_installs():
    torch = requirements()["torch"].specifier
    assert [v for v in ZEROGPU_TORCH if v in torch], f"ZeroGPU has no torch build in {torch}"
    floors = [Version(s.version) for s in torch if s.operator == ">="]
    assert floors and min(floors) >= Version(ZEROGPU_TORCH[0]), "a torch older than ZeroGPU's oldest build is allowed"
    make = re.search(r"^TORCH_SPEC \?= torch==(\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert make and make.group(1) in torch, "make would install a torch outside requirements.txt's range"
    fallback = re.search(r'install -q "torch([^"]+)"', (ROOT / "Makefile").read_text())
    assert fallback and SpecifierSet(fallback.group(1)) == torch, (
        "the Makefile's fallback range is not requirements.txt's"
    )


def test_the_tested_torch_is_inside_the_range():
    import torch

    assert Version(torch.__version__) in requirements()["torch"].specifier


def test_the_space_header_names_a_python_zerogpu_runs():
    assert header()["python_version"] in ZEROGPU_PYTHON


def test_gradio_comes_with_its_mcp_extra_and_spaces_is_never_required():
    reqs = requirements()
    assert "mcp" in reqs["gradio"].extras, "KVVIZ_MCP needs gradio[mcp]"
    assert "spaces" not in reqs, "ZeroGPU provides `spaces`; elsewhere the app runs without it"
