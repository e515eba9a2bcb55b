"""The served app under the real ``spaces`` package: every model job admitted in the main process, then run in a
GPU call of its own; refusals explained; nothing depends on the worker being reused or forked afresh.

``python app.py`` runs as on a ZeroGPU Space (``SPACES_ZERO_GPU``, the device API at
``SPACES_ZERO_DEVICE_API_URL`` — here the fake one of :mod:`tests.zerogpu.device_api`) with the CPU shim
(``tests/zerogpu/cpu``, which also logs any model forward outside a GPU call) and ``KVVIZ_DEVICE=cpu``.
"""

from __future__ import annotations

import base64
import json
import threading
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.server import start_app, stop_app
from tests.zerogpu.conftest import zero_env

pytestmark = pytest.mark.slow
ANSWER_S = 120.0  # far above a solo run of these requests on two busy cores (a few seconds each)
FRANCE = ("What is the capital of France?", 8, True, 0.0, 1.0, 0)
EVICT = ("Write one sentence about the sea.", "streaming_llm", 12, None, True, 4, {"sinks": 2})


@pytest.fixture(scope="module")
def zero_app(device_api, tmp_path_factory):
    base = tmp_path_factory.mktemp("zerogpu")
    log = base / "outside.jsonl"
    running = start_app(base, extra_env=zero_env(device_api, FAKE_ZEROGPU_LOG=str(log)))
    yield running, log
    stop_app(running.proc)


def _predict(url: str, *args, api_name: str, headers: dict | None = None):
    """``Client.predict`` that gives up after ANSWER_S (a hang is a failure this suite exists to catch)."""
    from gradio_client import Client

    box: dict = {}

    def call() -> None:
        try:
            box["out"] = Client(url, verbose=False, headers=headers).predict(*args, api_name=api_name)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            box["err"] = exc

    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(ANSWER_S)
    if t.is_alive():
        pytest.fail(f"{api_name} gave no answer within {ANSWER_S:.0f} s under ZeroGPU")
    if "err" in box:
        raise box["err"]
    return box["out"]


def test_generate_answers_in_one_gpu_call_with_its_own_duration(zero_app, api):
    app, log = zero_app
    out = _predict(app.url, *FRANCE, api_name="/generate")
    assert "Paris" in out["text"] and out["max_abs_logit_diff_vs_recompute"] < 1e-3
    schedules = api.of("/schedule")
    assert len(schedules) == 1 and len(api.of("/release")) == 1
    short = int(schedules[0].params["durationSeconds"])
    _predict(app.url, "word " * 600, 48, False, 0.0, 1.0, 0, api_name="/generate")
    assert int(api.of("/schedule")[1].params["durationSeconds"]) > short  # a longer job asks for more
    assert not (log.exists() and log.read_text().strip())  # no model forward ran outside a GPU call


@pytest.mark.parametrize("idle", [True, False])
def test_the_answer_is_the_same_whether_the_worker_is_reused_or_forked_again(zero_app, api, idle):
    app, _ = zero_app
    api.idle = idle
    first = _predict(app.url, *FRANCE, api_name="/generate")
    second = _predict(app.url, *FRANCE, api_name="/generate")
    assert first["text"] == second["text"] and "Paris" in first["text"]
    assert first["steps"] == second["steps"]
    assert len(api.of("/schedule")) == 2
    allowed = len(api.of("/allow"))  # one per new worker
    assert allowed <= 1 if idle else allowed == 2


def test_a_queued_job_holds_no_gpu_the_main_process_admits_one_at_a_time(zero_app, api):
    """KVVIZ_CONCURRENCY=1: the second of two simultaneous eviction runs waits in the main process's gate, and
    asks ZeroGPU for a GPU only after the first gave its back. (Admitted inside the worker, both would lease
    a GPU at once, each worker with its own copy of the gate, and the waiting one would spend GPU seconds.)"""
    app, _ = zero_app
    outs: list = []
    threads = [
        threading.Thread(target=lambda: outs.append(_predict(app.url, *EVICT, api_name="/evict")), daemon=True)
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(2 * ANSWER_S)
    assert [o["n_kept"] for o in outs] == [12, 12]
    order = [p for p in api.paths() if p in ("/schedule", "/release")]
    assert order == ["/schedule", "/release", "/schedule", "/release"], order


def _token(payload: dict) -> str:
    body = base64.urlsafe_b64encode(json.dumps(payload).encode()).decode().rstrip("=")
    return f"e30.{body}.sig"


def test_refusals_reach_the_visitor_explained(zero_app, api):
    from gradio_client.exceptions import AppError

    app, _ = zero_app
    api.left_s = 3
    with pytest.raises(AppError, match="your GPU quota for today has less left") as quota:
        _predict(app.url, *FRANCE, api_name="/generate", headers={"X-IP-Token": _token({"user": "visitor"})})
    assert "exceeded your ZeroGPU quota" in str(quota.value)
    with pytest.raises(AppError, match="no Hugging Face visitor token"):
        _predict(app.url, *FRANCE, api_name="/generate")
    api.left_s, api.available = 10_000, False
    with pytest.raises(AppError, match="ZeroGPU had no GPU free for this job"):
        _predict(app.url, *EVICT, api_name="/evict")
    assert not api.of("/allow")
    with urllib.request.urlopen(app.url + "metrics", timeout=30) as resp:  # counted by reason in the main process
        refused = {
            s.labels["reason"]: s.value
            for f in text_string_to_metric_families(resp.read().decode())
            for s in f.samples
            if s.name == "kvviz:refusals_total"
        }
    assert refused["zerogpu_quota"] >= 1 and refused["zerogpu_space_limit"] >= 1 and refused["zerogpu_no_gpu"] >= 1


def test_evict_memory_and_blocks_answer(zero_app, api):
    app, _ = zero_app
    assert _predict(app.url, *EVICT, api_name="/evict")["n_kept"] == 12
    mem = _predict(app.url, "Llama-3-70B", 8192, 162, "bf16", None, 8, 80, 0.1, 140, 3.35, None, api_name="/memory")
    assert mem["bytes_per_token"] == 327_680
    blocks = _predict(app.url, ["Hello there.", "Hello there, friend."], True, 16, None, None, api_name="/blocks")
    assert blocks["block_size"] == 16
    assert all(int(c.params["durationSeconds"]) > 0 for c in api.of("/schedule"))
