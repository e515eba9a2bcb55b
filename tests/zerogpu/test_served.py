"""The served app under the ZeroGPU stand-in: each named endpoint answers, every model job inside a GPU call.

``python app.py`` runs with ``tests/zerogpu`` on its path (so ``import spaces`` finds the stand-in) and
``SPACES_ZERO_GPU`` set, as on a ZeroGPU Space. A design whose model work relies on a thread of the main
process (the batching engine) never answers here; one whose state lives in the worker loses it.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from tests.server import start_app, stop_app

pytestmark = pytest.mark.slow
HERE = Path(__file__).parent
ANSWER_S = 90.0  # far above a solo run of these requests on two cores (a few seconds each)


def start_zero_app(base: Path):
    """``python app.py`` as on a ZeroGPU Space, with the stand-in ``spaces``; returns (app, its GPU-call log)."""
    log = base / "gpu-calls.jsonl"
    env = {"PYTHONPATH": str(HERE), "SPACES_ZERO_GPU": "true", "FAKE_ZEROGPU_LOG": str(log)}
    return start_app(base, extra_env=env), log


@pytest.fixture(scope="module")
def zero_app(tmp_path_factory):
    running, log = start_zero_app(tmp_path_factory.mktemp("zerogpu"))
    yield running, log
    stop_app(running.proc)


def calls(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _predict(url: str, *args, api_name: str):
    """``Client.predict`` that gives up after ANSWER_S (a hang is the failure this suite exists to catch)."""
    from gradio_client import Client

    box: dict = {}

    def call() -> None:
        try:
            box["out"] = Client(url, verbose=False).predict(*args, api_name=api_name)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            box["err"] = exc

    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(ANSWER_S)
    if t.is_alive():
        pytest.fail(f"{api_name} gave no answer within {ANSWER_S:.0f} s under ZeroGPU's process model")
    if "err" in box:
        raise box["err"]
    return box["out"]


def test_generate_answers_inside_one_gpu_call(zero_app):
    app, log = zero_app
    before = len(calls(log))
    out = _predict(app.url, "What is the capital of France?", 8, True, 0.0, 1.0, 0, api_name="/generate")
    assert "Paris" in out["text"]
    assert out["max_abs_logit_diff_vs_recompute"] < 1e-3
    made = calls(log)[before:]
    assert len(made) == 1, made


def test_no_model_forward_runs_outside_a_gpu_call(zero_app):
    """ZeroGPU's main process has no GPU: start-up work (warm-up, show-me examples) must run inside GPU calls."""
    app, log = zero_app
    _predict(app.url, "Hi", 2, True, 0.0, 1.0, 0, api_name="/generate")
    assert not [c for c in calls(log) if "outside" in c]


def test_a_short_request_fits_a_visitors_quota(tmp_path):
    """A visitor with a minute left can still send a short chat request: its duration is computed, not fixed."""
    log = tmp_path / "gpu-calls.jsonl"
    env = {
        "PYTHONPATH": str(HERE),
        "SPACES_ZERO_GPU": "true",
        "FAKE_ZEROGPU_LOG": str(log),
        "FAKE_ZEROGPU_QUOTA_S": "60",
    }
    running = start_app(tmp_path, extra_env=env)
    try:
        out = _predict(running.url, "What is the capital of France?", 16, True, 0.0, 1.0, 0, api_name="/generate")
        assert "Paris" in out["text"]
        asked = [c["duration"] for c in calls(log) if "duration" in c]
        assert asked and max(asked) <= 60, asked
    finally:
        stop_app(running.proc)


def test_evict_memory_and_blocks_answer(zero_app):
    app, log = zero_app
    out = _predict(
        app.url,
        "Write one sentence about the sea.",
        "streaming_llm",
        12,
        None,
        True,
        4,
        {"sinks": 2},
        api_name="/evict",
    )
    assert out["n_kept"] == 12
    mem = _predict(app.url, "Llama-3-70B", 8192, 162, "bf16", None, 8, 80, 0.1, 140, 3.35, None, api_name="/memory")
    assert mem["bytes_per_token"] == 327_680
    blocks = _predict(app.url, ["Hello there.", "Hello there, friend."], True, 16, None, None, api_name="/blocks")
    assert blocks["block_size"] == 16
    assert all(c["duration"] > 0 for c in calls(log) if "duration" in c)
