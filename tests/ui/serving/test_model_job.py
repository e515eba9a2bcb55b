"""kvviz.ui.serving.model_job: every handler that runs the model goes through the one wrapper, each call asks
the GPU for a duration from its own cost, and a ZeroGPU quota refusal is a message in the page."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import gradio as gr
import pytest

from kvviz.limits import GPU_LEASE_FLOOR_S
from kvviz.settings import Settings
from kvviz.ui.blocks import tab as blocks_tab
from kvviz.ui.generate import run as generate_run
from kvviz.ui.generate.views import Form
from kvviz.ui.serving import model_job
from kvviz.ui.serving.context import AppContext
from kvviz.ui.serving.identity import session_of

UI = Path(model_job.__file__).resolve().parents[1]

# every Gradio step that runs the model, by (handler name, job); a new one must be added here
RUN_STEPS = {
    ("run", "generation"),
    ("api_generate", "generation"),
    ("api_chat", "generation"),
    ("run", "eviction run"),
    ("evict", "eviction run"),
    ("run_compare", "comparison"),
    ("run_compose", "composition"),
    ("run_needle", "needle demo"),
    ("run_sinks", "sinks demo"),
    ("run", "block view"),
    ("blocks", "block view"),
    ("run", "prefix sharing"),
    ("run", "side-channel timing"),
    ("run", "eviction × paging"),
    ("run_analyze", "quantization analysis"),
    ("run_maps", "key/value maps"),
    ("run_generate", "quantized generation"),
    ("run_table", "no-cache table"),
    ("run_measure", "cache vs no-cache timing"),
    ("run_example", "walkthrough example"),
    ("show", "answer"),
    ("run_own", "sweep"),
    ("run", "cache debugger"),
    ("break_cache", "cache debugger"),
    ("run", "disk-tier demo"),
    ("run_live", "KV-budget replay"),
    ("serve_sim", "KV-budget replay"),
    ("run", "two-turn chat"),
}
# buttons whose click is a quick check step, then the run
CHECKED = {
    "generation",
    "eviction run",
    "comparison",
    "composition",
    "block view",
    "prefix sharing",
    "side-channel timing",
    "eviction × paging",
    "disk-tier demo",
    "KV-budget replay",
    "two-turn chat",
}


@pytest.fixture(scope="module")
def ctx(lm):
    return AppContext(lm=lm, settings=Settings(max_prompt_tokens=8192, max_new_tokens=512))


@pytest.fixture(scope="module")
def demo(lm):
    from kvviz.ui.app import build_app

    return build_app(AppContext(lm=lm, settings=Settings(precompute=False)))


def test_every_model_step_is_declared_through_the_wrapper(demo):
    jobs = [(f, getattr(f.fn, model_job.MARK, None)) for f in demo.fns.values() if f.fn is not None]
    runs = {(f.name, job.what) for f, job in jobs if job is not None and not f.name.startswith("check_")}
    checks = {job.what for f, job in jobs if job is not None and f.name.startswith("check_")}
    assert runs == RUN_STEPS
    assert checks == CHECKED
    for f, job in jobs:
        if job is not None:
            assert f.api_visibility == (
                "public"
                if f.api_name in ("generate", "chat", "evict", "blocks", "break_cache", "serve_sim")
                else "private"
            )
            assert f.concurrency_limit is None  # the gates are the model's queues


def test_no_handler_reaches_the_gate_or_the_gpu_but_through_the_wrapper():
    verbs = re.compile(r"jobs\.(admit|start|hold|take|turns|precheck)\(|\bgpu\(|Background\(|\.room\.admit\(")
    allowed = {UI / "serving" / n for n in ("model_job.py", "job.py", "gpu.py", "jobs.py", "streaming.py")}
    offenders = [str(p.relative_to(UI)) for p in UI.rglob("*.py") if p not in allowed and verbs.search(p.read_text())]
    assert offenders == [], f"model work outside kvviz/ui/serving/model_job.py and job.py: {offenders}"


def test_a_short_chat_asks_the_gpu_for_far_less_than_a_long_prompt(ctx):
    short = (Form("Hi there, how are you?", True, 16),)
    long = (Form("word " * 4096, False, 512),)
    n_long = len(generate_run.ask(ctx, *long).ids)
    assert 4000 <= n_long <= 4200
    seconds_short = generate_run.generation.lease(ctx, generate_run.ask, short)
    seconds_long = generate_run.generation.lease(ctx, generate_run.ask, long)
    assert GPU_LEASE_FLOOR_S <= seconds_short <= seconds_long / 4
    assert seconds_long <= min(ctx.settings.max_job_seconds, model_job.GPU_LEASE_CEILING_S)
    # a request that will be refused asks for the floor: it ends before any model work
    assert generate_run.generation.lease(ctx, generate_run.ask, (Form("", True, 16),)) == GPU_LEASE_FLOOR_S


FAKE_SPACES = """
calls = []
refuse = []
probe = []  # functions called as a GPU call starts, before the job runs; what they return goes to ``entered``
entered = []

def GPU(duration=60):
    def wrap(fn):
        def call(*a, **k):
            calls.append(duration(*a, **k) if callable(duration) else duration)
            entered.extend(p() for p in probe)
            if refuse:
                raise RuntimeError("You have exceeded your GPU quota (15s requested vs. 9s left).")
            return fn(*a, **k)
        return call
    return wrap
"""


@pytest.fixture
def fake_spaces(tmp_path, monkeypatch):
    (tmp_path / "spaces.py").write_text(FAKE_SPACES)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "spaces", raising=False)
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    import spaces

    yield spaces
    sys.modules.pop("spaces", None)


def test_on_zerogpu_each_call_asks_its_own_duration_and_a_quota_refusal_is_a_message(ctx, fake_spaces):
    handler = blocks_tab.block_view.handler(ctx)
    trace = handler(None, "Hello!", True, 2)
    asked = blocks_tab.block_view.lease(ctx, blocks_tab.prompt_request, ("Hello!", True, 2))
    assert trace.n_generated >= 1 and fake_spaces.calls == [asked]
    assert ctx.jobs.gate.snapshot() == {"running": 0, "waiting": 0, "sessions": 0}
    fake_spaces.refuse.append(True)
    with pytest.raises(gr.Error, match=f"ZeroGPU refused this job before it started: it asks the GPU for {asked} s"):
        handler(None, "Hello!", True, 2)


def test_on_zerogpu_a_job_is_admitted_in_the_main_process_before_its_gpu_call(ctx, fake_spaces):
    """The GPU call starts only once the main process's gate runs the job: waiting in line spends no GPU
    seconds, and the gate sees every job (a forked worker's copy of it would see only its own)."""
    fake_spaces.probe.append(lambda: ctx.jobs.gate.snapshot()["running"])
    blocks_tab.block_view.handler(ctx)(None, "Hello!", True, 2)
    endpoint = model_job.endpoint(ctx, generate_run.api_generate, generate_run.api_generate_job)  # /generate
    fake_spaces.probe[:] = [lambda: ctx.jobs.room.snapshot()["running"]]
    assert "Paris" in endpoint("What is the capital of France?", 8, True, 0.0, 1.0, 0)["text"]
    assert fake_spaces.entered == [1, 1]
    assert ctx.jobs.gate.snapshot()["running"] == 0 and ctx.jobs.room.snapshot()["running"] == 0


def test_a_check_takes_no_place_and_a_run_gives_its_place_back(ctx):
    check = blocks_tab.block_view.checker(ctx)
    assert check(None, "Hello!", True, 2) == blocks_tab.block_view.check(ctx, "Hello!", True, 2)  # handed to the run
    assert ctx.jobs.gate.snapshot() == {"running": 0, "waiting": 0, "sessions": 0}
    with pytest.raises(gr.Error, match="Tokens to generate"):
        check(None, "Hello!", True, 10_000)
    holder = ctx.jobs.room.admit(session_of(None), "generation")  # the same (in-process) session's Generate run
    try:
        with pytest.raises(gr.Error, match="still running"):
            check(None, "Hello!", True, 2)
    finally:
        holder.release()
    with pytest.raises(gr.Error, match="Block view run failed"):
        blocks_tab.block_view.with_(run=lambda job: 1 / 0)(ctx, "Hello!", True, 2)
    assert ctx.jobs.gate.snapshot() == {"running": 0, "waiting": 0, "sessions": 0}


def test_a_click_checks_its_inputs_once_and_hands_the_request_to_the_run(ctx):
    """The check step builds the request; the run step reads only the state it wrote, never the widgets."""
    calls = []

    def check(ctx, text):
        calls.append(text)
        return str(text)

    echo = model_job.ModelJob("echo", check=check, run=lambda job: job.req.upper(), size=lambda r: model_job.Size(1, 1))
    with gr.Blocks() as demo:
        box, out, button = gr.Textbox("hi"), gr.Textbox(), gr.Button()
        echo.button(ctx, button, [box], [out])
    (first,) = [f for f in demo.fns.values() if (button._id, "click") in [tuple(t) for t in f.targets]]
    (then,) = [f for f in demo.fns.values() if f.trigger_after == first._id]
    assert [c._id for c in then.inputs] == [c._id for c in first.outputs]  # the run reads the handed request
    assert then.inputs[0].stateful and box not in then.inputs
    request = first.fn(None, "hi")
    assert then.fn(None, request) == "HI" and calls == ["hi"]
    with pytest.raises(gr.Error, match="not checked"):
        then.fn(None, None)


def test_a_model_job_hands_its_threads_openmp_workers_back_after_each_step(ctx, monkeypatch):
    """Gradio runs each step in one of its long-lived worker threads: a pool kept there would put the engine's thread
    on libgomp's throttled spin (kvviz.openmp), so the wrapper hands it back after each step and at the end."""
    from kvviz import openmp

    seen, released = [], []
    monkeypatch.setattr(openmp, "release", lambda: released.append(len(seen)) or True)

    def steps(job):
        for i in range(2):
            seen.append(i)
            yield i

    size = lambda r: model_job.Size(1, 1)  # noqa: E731
    stream = model_job.ModelJob("echo", check=lambda ctx, text: text, run=steps, size=size)
    assert list(stream(ctx, "x")) == [0, 1]
    assert released == [1, 2, 2]  # after each step it computed, and once more as it ends
    released.clear()
    plain = model_job.ModelJob("echo", check=lambda ctx, text: text, run=lambda job: "done", size=size)
    assert plain(ctx, "x") == "done" and released == [2]
