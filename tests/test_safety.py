"""kvviz.safety: prompt and number checks, model specs in public mode, config JSON, per-session temp files,
and trust_remote_code never enabled (by reading the source and by loading a model that ships code)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from kvviz.limits import MAX_TEMPERATURE, MIN_TEMPERATURE, MIN_TOP_P
from kvviz.models import BUNDLED, ModelLoadError, load_model, resolve_spec
from kvviz.safety import (
    SessionFiles,
    check_model_spec,
    clean_prompt,
    json_chars,
    looks_like_path,
    parse_config_json,
    real_number,
    remove_stale,
    temperature,
    top_p,
    whole_number,
)
from kvviz.settings import HUB_DEFAULT

ROOT = Path(__file__).resolve().parents[1]


# --- prompts
@pytest.mark.parametrize("text", ["", "   ", "\n\t", "\x00\x01\x1b", None])
def test_empty_prompts_are_refused(text):
    with pytest.raises(ValueError, match="prompt is empty"):
        clean_prompt(text, 100)


def test_prompt_keeps_printable_unicode_and_drops_controls():
    assert clean_prompt("a\x00b\x07c\n\td", 100) == "abc\n\td"
    odd = "🙂 مرحبا \u202eabc\u202c zero\u200dwidth"
    assert clean_prompt(odd, 100) == odd


def test_prompt_refuses_surrogates_long_text_and_non_text():
    with pytest.raises(ValueError, match="invalid characters"):
        clean_prompt("abc\ud800", 100)
    with pytest.raises(ValueError, match="101 characters; the limit is 100"):
        clean_prompt("x" * 101, 100)
    with pytest.raises(ValueError, match="must be text"):
        clean_prompt(12, 100)


# --- numbers
@pytest.mark.parametrize("value, expected", [(3, 3), (3.0, 3), ("7", 7), (" 1 ", 1), (10, 10)])
def test_whole_number_accepts(value, expected):
    assert whole_number(value, "N", 1, 10) == expected


@pytest.mark.parametrize(
    "value, message",
    [
        (0, "between 1 and 10; got 0"),
        (-5, "between 1 and 10"),
        (11, "got 11"),
        (2.5, "whole number"),
        (math.nan, "whole number"),
        (math.inf, "whole number"),
        (-math.inf, "whole number"),
        (True, "whole number"),
        (None, "whole number"),
        ("ten", "not 'ten'"),
        ([1], "whole number"),
        (1e300, "got 1e\\+300"),
    ],
)
def test_whole_number_refuses(value, message):
    with pytest.raises(ValueError, match=message):
        whole_number(value, "N", 1, 10)


def test_real_number():
    assert real_number("0.5", "p", 0, 1) == 0.5
    assert real_number(1, "p", 0, 1, lo_open=True) == 1.0
    for bad in (0, -0.1, 1.01, math.nan, math.inf, "x", None, False):
        with pytest.raises(ValueError, match=r"p must be a number in \(0, 1\]"):
            real_number(bad, "p", 0, 1, lo_open=True)


# --- model specs
@pytest.mark.parametrize("value", ["1e-38", 5e-324, "5e-324", 1e-38, MIN_TEMPERATURE / 2])
def test_a_temperature_too_small_to_divide_by_is_greedy(value):
    assert temperature(value) == 0.0


def test_temperature_keeps_its_range():
    assert temperature(None) == 0.0 and temperature("0.7") == 0.7 and temperature(MIN_TEMPERATURE) == MIN_TEMPERATURE
    for bad in (-1e-38, MAX_TEMPERATURE * 1.01, "nan", "inf", "hot", True):
        with pytest.raises(ValueError, match="Temperature"):
            temperature(bad)


@pytest.mark.parametrize("value", [1e-300, 5e-324, "1e-300", 1e-7])
def test_a_top_p_float32_cannot_hold_keeps_the_top_token(value):
    assert top_p(value) == MIN_TOP_P


def test_top_p_keeps_its_range():
    assert top_p(None) == 1.0 and top_p("0.9") == 0.9 and top_p(MIN_TOP_P) == MIN_TOP_P
    for bad in (0, -1e-300, 1.01, "nan", True, "-0"):
        with pytest.raises(ValueError, match="Top-p"):
            top_p(bad)


def test_sampling_with_the_smallest_top_p_is_greedy():
    import torch

    from kvviz.capture.model_io import Sampling, sample

    logits = torch.tensor([0.1, 3.0, 2.9, -1.0])
    for p in (MIN_TOP_P, 5e-324):  # a raw 5e-324 (the library's own callers) too: float32 makes it 0
        picks = {sample(logits, Sampling(0.7, p, seed), torch.Generator().manual_seed(seed)) for seed in range(20)}
        assert picks == {1}


def _nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    "value",
    [
        "x" * 5000,
        ["x" * 200_000] * 64,
        [1] * 10**6,
        {"k" * 5000: 1},
        {"a": ["y" * 5000]},
        _nested(10**5),
        [{"role": "user", "content": "z" * 3000}, {"role": "assistant", "content": "z" * 3000}],
    ],
    ids=["text", "list of long texts", "many items", "long key", "nested text", "deep", "messages"],
)
def test_json_chars_bounds_every_shape_in_work_it_stops(value):
    assert json_chars(value, 4096) == 4097
    assert json_chars(value, 10**9) >= 4096


def test_json_chars_counts_small_values_about_as_json_does():
    for value in ([], {}, "", 12, None, True, [{"role": "user", "content": "Hi"}], {"a": [1, 2, {"b": "c"}]}):
        assert json_chars(value, 10**6) >= len(json.dumps(value, separators=(",", ":")))


@pytest.mark.parametrize("value", ["-0", "-0.0", -0.0, " -0 "])
def test_negative_zero_is_refused_where_zero_is_allowed(value):
    with pytest.raises(ValueError, match="minus sign"):
        real_number(value, "Temperature", 0.0, 5.0)
    with pytest.raises(ValueError, match="minus sign"):
        whole_number(value, "Seed", 0, 10)
    assert real_number(0, "Temperature", 0.0, 5.0) == 0.0 and whole_number("0", "Seed", 0, 10) == 0


def test_private_deployment_loads_anything():
    assert check_model_spec("/some/folder", public=False, allowed=[]) == "/some/folder"
    assert check_model_spec(None, public=True, allowed=[]) is None


@pytest.mark.parametrize(
    "spec",
    ["/etc", "/etc/passwd", "~/models/x", "./model", "../x", "C:\\models\\x", "folder\\model", str(ROOT / "kvviz")],
)
def test_public_deployment_refuses_local_paths(spec):
    assert looks_like_path(spec)
    with pytest.raises(ValueError, match="local path"):
        check_model_spec(spec, public=True, allowed=[HUB_DEFAULT, spec])


def test_public_deployment_uses_the_allowlist():
    allowed = [HUB_DEFAULT, "bundled"]
    assert check_model_spec(HUB_DEFAULT, public=True, allowed=allowed) == HUB_DEFAULT
    assert check_model_spec("bundled", public=True, allowed=allowed) == "bundled"
    with pytest.raises(ValueError, match="not on this deployment's allowlist"):
        check_model_spec("meta-llama/Llama-3.1-8B", public=True, allowed=allowed)
    with pytest.raises(ValueError, match="not a Hugging Face model id"):
        check_model_spec("just-a-name", public=True, allowed=allowed)
    with pytest.raises(ValueError, match="allowlist"):
        check_model_spec("bundled", public=True, allowed=[HUB_DEFAULT])


def test_space_default_model_is_the_hub_copy(monkeypatch):
    monkeypatch.delenv("KVVIZ_MODEL", raising=False)
    monkeypatch.delenv("SPACE_ID", raising=False)
    assert resolve_spec(None) == BUNDLED
    monkeypatch.setenv("SPACE_ID", "someone/kvviz")
    assert resolve_spec(None) == HUB_DEFAULT == "HuggingFaceTB/SmolLM2-135M-Instruct"
    monkeypatch.setenv("KVVIZ_MODEL", "other/model")
    assert resolve_spec(None) == "other/model"
    assert resolve_spec("bundled") == BUNDLED


# --- config JSON
def test_config_json_parses_objects_only():
    cfg = {"model_type": "llama", "num_hidden_layers": 30, "rope_scaling": {"factor": 8.0}}
    assert parse_config_json(json.dumps(cfg), 4096) == cfg
    assert parse_config_json(json.dumps(cfg).encode(), 4096) == cfg
    assert parse_config_json(b"\xef\xbb\xbf" + json.dumps(cfg).encode(), 4096) == cfg  # BOM from Windows editors


@pytest.mark.parametrize(
    "data, message",
    [
        ("{not json", "not valid JSON"),
        ("", "empty"),
        (None, "No config"),
        ("[1, 2]", "JSON object"),
        ('"text"', "JSON object"),
        ('{"a": NaN}', "NaN"),
        ('{"a": Infinity}', "Infinity"),
        (b"\xff\xfe{}", "UTF-8"),
        ("x" * 5000, "limit is 4,096 bytes"),
        ("[" * 1500 + "]" * 1500, "nested too deeply|JSON object"),
        ('{"a":' * 40 + "1" + "}" * 40, "nested too deeply"),
        (12, "must be JSON text"),
        ("import os; os.system('x')", "not valid JSON"),
        (b"\x80\x04\x95pickle", "UTF-8|not valid JSON"),
    ],
)
def test_config_json_refuses(data, message):
    with pytest.raises(ValueError, match=message):
        parse_config_json(data, 4096)


# --- per-session temporary files
def test_session_files_are_private_per_session_and_removed(tmp_path):
    files = SessionFiles(tmp_path)
    a1, a2, b = files.run_folder("alice"), files.run_folder("alice"), files.run_folder("bob")
    assert a1 != a2 and a1.parent == a2.parent != b.parent
    assert files.root.parent == tmp_path and a1.is_relative_to(files.root)
    assert "alice" not in str(a1) and "bob" not in str(b)  # session ids are hashed, never path parts
    (a1 / "x.csv").write_text("1")
    (b / "y.csv").write_text("2")
    files.forget("alice")
    assert not a1.exists() and (b / "y.csv").exists()
    assert len(files.sessions()) == 1
    files.cleanup()
    assert not files.root.exists()
    assert list(tmp_path.iterdir()) == []


def test_session_files_make_nothing_until_used(tmp_path):
    files = SessionFiles(tmp_path)
    files.forget("nobody")
    assert files.sessions() == [] and list(tmp_path.iterdir()) == []


# --- trust_remote_code
def test_trust_remote_code_is_never_enabled_in_the_source():
    hits = []
    for path in [*ROOT.glob("kvviz/**/*.py"), ROOT / "app.py", *ROOT.glob("bench/*.py")]:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if "trust_remote_code" in line:
                hits.append((path.relative_to(ROOT), n, line))
    assert hits, "expected explicit trust_remote_code=False in kvviz/models.py"
    for path, n, line in hits:
        uses = re.findall(r"trust_remote_code\s*=\s*([^,)\s]+)", line)
        assert all(u == "False" for u in uses), f"{path}:{n} passes trust_remote_code={uses}"


def test_a_model_that_ships_code_never_runs_it(tmp_path):
    marker = tmp_path / "code-ran"
    folder = tmp_path / "evil-model"
    folder.mkdir()
    code = f"from pathlib import Path\nPath({str(marker)!r}).write_text('pwned')\n"
    (folder / "evil.py").write_text(
        code + "from transformers import PretrainedConfig\n"
        "class EvilConfig(PretrainedConfig):\n    model_type = 'kvviz-evil'\n"
    )
    (folder / "config.json").write_text(
        json.dumps(
            {
                "model_type": "kvviz-evil",
                "architectures": ["EvilModel"],
                "auto_map": {
                    "AutoConfig": "evil.EvilConfig",
                    "AutoModelForCausalLM": "evil.EvilModel",
                    "AutoTokenizer": ["evil.EvilTokenizer", None],
                },
            }
        )
    )
    with pytest.raises(ModelLoadError, match="Could not load model"):
        load_model(str(folder))
    assert not marker.exists(), "the model's own Python code was executed"


def test_one_config_limit_for_files_pasted_text_and_the_deployment(tmp_path):
    from kvviz.limits import MAX_CONFIG_BYTES
    from kvviz.memory.layout import cache_layout
    from kvviz.settings import Settings

    assert Settings().max_config_bytes == MAX_CONFIG_BYTES
    big = {
        "model_type": "llama",
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "hidden_size": 64,
        "padding": "x" * MAX_CONFIG_BYTES,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(big))
    for source in (path, json.dumps(big)):
        with pytest.raises(ValueError, match=f"the limit is {MAX_CONFIG_BYTES:,} bytes"):
            cache_layout(source)
    del big["padding"]
    path.write_text(json.dumps(big))
    assert cache_layout(path).num_layers == 2


def dead_pid() -> int:
    """The id of a process that has just ended."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_killed_servers_folder_is_removed_and_a_live_ones_kept(tmp_path):
    import os

    files = SessionFiles(tmp_path)
    (files.run_folder("s") / "kvviz-trace.npz").write_bytes(b"x")
    live = files.root
    assert live.name.startswith(f"kvviz-{os.getpid()}-")
    dead = tmp_path / f"kvviz-{dead_pid()}-abc123"
    (dead / "session").mkdir(parents=True)
    (dead / "session" / "kvviz-trace.npz").write_bytes(b"a stranger's export")
    other = tmp_path / "kvviz-load-xyz"  # not a SessionFiles folder
    other.mkdir()
    link = tmp_path / f"kvviz-{dead_pid()}-link"
    link.symlink_to(other)
    assert remove_stale(tmp_path) == [dead]
    assert not dead.exists() and live.exists() and other.exists() and link.is_symlink()
