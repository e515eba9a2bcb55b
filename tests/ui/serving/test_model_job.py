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
                "public" if f.api_name in ("generate", "chat", "evict", "blocks") else "private"
            )
            assert f.concurrency_limit is None  # the gates are the model's queues


def test_no_handler_reaches_the_gate_or_the_gpu_but_through_the_wrapper():
    verbs = re.compile(r"jobs\.(admit|start|hold|take|turns|precheck)\(|\bgpu\(|Background\(|\.room\.admit\(")
    allowed = {UI / "serving" / n for n in ("model_job.py", "gpu.py", "jobs.py", "streaming.py")}
    offenders = [str(p.relative_to(UI)) for p in UI.rglob("*.py") if p not in allowed and verbs.search(p.read_text())]
    assert offenders == [], f"model work outside kvviz/ui/serving/model_job.py: {offenders}"


def test_a_short_chat_asks_the_gpu_for_far_less_than_a_long_prompt(ctx):
    short = ("Hi there, how are you?", True, 16, 0.0, 1.0, 0)
    long = ("word " * 4096, False, 512, 0.0, 1.0, 0)
    n_long = len(generate_run.ask(ctx, *long).ids)
    assert 4000 <= n_long <= 4200
    seconds_short = generate_run.generation.lease(ctx, generate_run.ask, short)
    seconds_long = generate_run.generation.lease(ctx, generate_run.ask, long)
    assert GPU_LEASE_FLOOR_S <= seconds_short <= seconds_long / 4
    assert seconds_long <= min(ctx.settings.max_job_seconds, model_job.GPU_LEASE_CEILING_S)
    # a request that will be refused asks for the floor: it ends before any model work
    assert generate_run.generation.lease(ctx, generate_run.ask, ("", True, 16, 0.0, 1.0, 0)) == GPU_LEASE_FLOOR_S


FAKE_SPACES = """
calls = []
refuse = []

def GPU(duration=60):
    def wrap(fn):
        def call(*a, **k):
            calls.append(duration(*a, **k) if callable(duration) else duration)
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
    with pytest.raises(gr.Error, match=f"ZeroGPU refused this job: it asks the GPU for {asked} s"):
        handler(None, "Hello!", True, 2)


def test_a_check_takes_no_place_and_a_run_gives_its_place_back(ctx):
    check = blocks_tab.block_view.checker(ctx)
    assert check(None, "Hello!", True, 2) is None
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
