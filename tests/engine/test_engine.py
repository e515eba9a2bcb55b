"""The engine against solo runs: tokens, logits and every Trace array equal, however runs join and leave."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from kvviz.capture.drive import drive
from kvviz.capture.generation import Generation
from kvviz.capture.model_io import Sampling
from kvviz.capture.options import options
from kvviz.capture.packed import packable
from kvviz.engine.engine import Engine
from kvviz.engine.handle import wait_all
from tests.tiny_models import tiny_model

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def keep_logits(monkeypatch):
    """Finished runs drop their cache and recorder as usual but keep their logits, for the comparison."""
    real = Generation.release

    def release(self) -> None:
        logits = self.logits_seen
        real(self)
        self.logits_seen = logits

    monkeypatch.setattr(Generation, "release", release)


ARRAYS = ["colsum", "prefill_colsum", "sink_mass", "window_rows", "key_norms", "value_norms", "key_channel_absmean"]
HALF = ["prefill_map", "decode_rows"]  # stored in fp16: equal to fp16 rounding


def solo(lm, prompt, **kwargs) -> Generation:
    """One run alone, through the same Generation the engine drives (its logits kept)."""
    g = drive(lm, Generation(lm, prompt, **options(verify=True, **kwargs)))
    g.finish()
    return g


def assert_same_run(batched: Generation, alone: Generation) -> None:
    a, b = batched.trace, alone.trace
    assert a.token_ids == b.token_ids
    assert a.stop_reason == b.stop_reason
    diff = max((x - y).abs().max().item() for x, y in zip(batched.logits_seen, alone.logits_seen))
    assert diff <= 1e-4, f"logits differ by {diff:.2e}"
    for name in ARRAYS:
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), atol=2e-5, rtol=1e-4, err_msg=name)
    for name in HALF:
        np.testing.assert_allclose(
            getattr(a, name).astype(np.float32), getattr(b, name).astype(np.float32), atol=2e-3, err_msg=name
        )
    assert [s.cache_lens for s in a.steps] == [s.cache_lens for s in b.steps]


PROMPTS = [
    ("What is the capital of France?", 6),
    ("Name three colours.", 9),
    ("Write one sentence about the sea and the wind over it.", 4),
    ("Hi", 7),
    ("Explain in a few words why the sky looks blue during the day.", 5),
    ("Count from one to five.", 8),
]


def test_runs_joining_and_leaving_equal_their_solo_runs(lm):
    assert packable(lm)
    engine = Engine(lm, max_batch=4, prefix_cache_bytes=0)  # no prefix reuse: batching alone
    first = [engine.submit(p, chat=True, max_new_tokens=n, verify=True) for p, n in PROMPTS[:3]]
    # later runs join while the first ones decode (continuous batching), and wait for a place when full
    next(iter(first[0].stream()))
    later = [engine.submit(p, chat=True, max_new_tokens=n, verify=True) for p, n in PROMPTS[3:]]
    handles = first + later
    assert wait_all(handles, 900)
    assert engine.counters["max_batch_seen"] >= 3
    assert engine.counters["max_batch_seen"] <= 4
    for h, (p, n) in zip(handles, PROMPTS):
        assert_same_run(h.run.gen, solo(lm, p, chat=True, max_new_tokens=n))
        eq = h.trace.equivalence
        assert eq["max_abs_logit_diff"] < 1e-3 and eq["unpatched_reference"] is True
        assert eq["max_abs_logit_diff_vs_unpatched"] < 1e-3


def test_an_idle_engine_gathers_the_runs_of_a_room_arriving_together(lm, monkeypatch):
    steps = []
    real = Engine._step
    monkeypatch.setattr(Engine, "_step", lambda self, batch: steps.append(len(batch)) or real(self, batch))
    engine = Engine(lm, prefix_cache_bytes=0, gather_s=0.5, gather_max_s=5.0)
    first = engine.submit("Name three colours.", chat=True, max_new_tokens=2)
    time.sleep(0.1)  # the second student presses a moment later: still before the first step
    second = engine.submit("Name three fruits.", chat=True, max_new_tokens=2)
    assert wait_all([first, second], 600)
    assert steps[0] == 2
    steps.clear()
    eager = Engine(lm, prefix_cache_bytes=0, gather_s=0.0)
    alone = eager.submit("Name three colours.", chat=True, max_new_tokens=2)
    time.sleep(0.3)
    later = eager.submit("Name three fruits.", chat=True, max_new_tokens=2)
    assert wait_all([alone, later], 600)
    assert steps[0] == 1  # without gathering the first run starts at once
    with pytest.raises(ValueError, match="gather_s"):
        Engine(lm, gather_s=-1)


def test_sampled_runs_keep_their_own_generator(lm):
    engine = Engine(lm, prefix_cache_bytes=0)
    settings = [Sampling(temperature=0.9, top_p=0.9, seed=s) for s in (1, 2)]
    handles = [engine.submit("Tell me a word.", chat=True, max_new_tokens=6, sampling=s) for s in settings]
    assert wait_all(handles, 600)
    for h, s in zip(handles, settings):
        alone = solo(lm, "Tell me a word.", chat=True, max_new_tokens=6, sampling=s)
        assert h.trace.token_ids == alone.trace.token_ids


def test_stopping_one_run_mid_batch_leaves_the_others(lm):
    engine = Engine(lm, prefix_cache_bytes=0)
    stop = threading.Event()
    stopped = engine.submit("Count from one to twenty.", chat=True, max_new_tokens=40, cancel=stop.is_set)
    other = engine.submit("Name three colours.", chat=True, max_new_tokens=12, verify=True)
    for trace in stopped.stream():
        if len(trace.steps) >= 3:
            stop.set()
    assert stopped.trace.stop_reason == "stopped"
    assert 3 <= len(stopped.trace.steps) < 40
    assert stopped.trace.colsum is not None  # a stopped run is still finished (summaries present)
    assert wait_all([other], 600)
    assert_same_run(other.run.gen, solo(lm, "Name three colours.", chat=True, max_new_tokens=12))


def test_identical_requests_share_one_run(lm):
    engine = Engine(lm)
    handles = [engine.submit("Say hello.", chat=True, max_new_tokens=5) for _ in range(5)]
    assert wait_all(handles, 600)
    assert len({id(h.run) for h in handles}) == 1
    late = engine.submit("Say hello.", chat=True, max_new_tokens=5)  # finished: answered from the kept run
    assert late.run is handles[0].run and late.result() is handles[0].trace
    assert engine.counters["shared"] == 5
    different = engine.submit("Say hello.", chat=True, max_new_tokens=6)
    assert different.run is not handles[0].run


def test_a_bad_request_is_refused_in_the_callers_thread(lm):
    engine = Engine(lm)
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.submit("Hi", max_new_tokens=0)
    with pytest.raises(ValueError, match="empty"):
        engine.submit("", chat=False, prompt_ids=[])
    assert engine.snapshot()["running"] == 0


@pytest.mark.parametrize("name", ["gpt2", "llama_mqa", "mistral"])
def test_tiny_architectures_batched_equal_solo(name):
    """GPT-2 (MHA, learned positions) and MQA run packed; a sliding-window model is not packable and
    runs one forward per sequence inside the same engine loop."""
    lm = tiny_model(name)
    assert packable(lm) == (name != "mistral")
    engine = Engine(lm, prefix_cache_bytes=0)
    prompts = ["abc de", "hello there, general", "x"]
    handles = [engine.submit(p, chat=False, max_new_tokens=5 + i) for i, p in enumerate(prompts)]
    assert wait_all(handles, 300)
    for i, (h, p) in enumerate(zip(handles, prompts)):
        alone = solo(lm, p, chat=False, max_new_tokens=5 + i)
        assert h.trace.token_ids == alone.trace.token_ids
        np.testing.assert_allclose(h.trace.colsum, alone.trace.colsum, atol=2e-5, rtol=1e-4)


def test_runs_ending_apart_share_one_check_and_a_lone_run_is_not_kept_waiting(lm, monkeypatch):
    from kvviz.engine import engine as engine_module

    calls = []
    real = engine_module.check
    monkeypatch.setattr(
        engine_module, "check", lambda lm, gens, timeout: calls.append(len(gens)) or real(lm, gens, timeout)
    )
    engine = Engine(lm, check_wait_s=600)  # longer than any run here: the short run waits for the long one
    short = engine.submit("Hi", chat=True, max_new_tokens=2, verify=True)
    long = engine.submit("Count from one to five.", chat=True, max_new_tokens=8, verify=True)
    assert wait_all([short, long], 600)
    assert calls == [2] and engine.counters["checks"] == 1
    for h in (short, long):
        assert h.trace.equivalence["max_abs_logit_diff"] < 1e-3 and h.trace.equivalence["positions_checked"] >= 2
    alone = engine.submit("Name three colours.", chat=True, max_new_tokens=3, verify=True)
    assert wait_all([alone], 600) and calls == [2, 1]  # nothing else decoding: checked at once


def test_a_finished_run_waits_for_its_check_at_most_check_wait_s(lm, monkeypatch):
    from kvviz.engine import engine as engine_module

    calls = []
    real = engine_module.check
    monkeypatch.setattr(
        engine_module, "check", lambda lm, gens, timeout: calls.append(len(gens)) or real(lm, gens, timeout)
    )
    engine = Engine(lm, check_wait_s=0.0)
    short = engine.submit("Hi", chat=True, max_new_tokens=2, verify=True)
    long = engine.submit("Count from one to twenty.", chat=True, max_new_tokens=40, verify=True)
    for _ in short.stream():
        pass
    assert not long.run.finished  # the short run's answer did not wait for the long run
    assert wait_all([long], 600) and calls == [1, 1]
    with pytest.raises(ValueError, match="check_wait_s"):
        Engine(lm, check_wait_s=-1)


def test_runs_submitted_inside_inference_mode_reuse_the_prefix_cache(lm):
    """A notebook's ``with torch.inference_mode():`` makes the run's recorder hold inference tensors; the
    engine replays a cached prefix into them, which only inference mode allows."""
    engine = Engine(lm)
    with torch.inference_mode():
        first = engine.submit("Name three colours.", chat=True, max_new_tokens=3, verify=True)
        assert wait_all([first], 600) and first.run.error is None
        second = engine.submit("Name three fruits.", chat=True, max_new_tokens=3, verify=True)
        assert wait_all([second], 600)
    assert second.run.error is None
    assert second.trace.cached_prompt_tokens > 0
    assert_same_run(second.run.gen, solo(lm, "Name three fruits.", chat=True, max_new_tokens=3))


def test_a_run_beside_one_that_cannot_end_soon_is_checked_at_once(lm, monkeypatch):
    from kvviz.engine import engine as engine_module

    calls = []
    real = engine_module.check
    monkeypatch.setattr(
        engine_module, "check", lambda lm, gens, timeout: calls.append(len(gens)) or real(lm, gens, timeout)
    )
    engine = Engine(lm, check_wait_s=10)  # the long run's 400-token budget needs far longer than 10 s
    stop = threading.Event()
    short = engine.submit("Hi", chat=True, max_new_tokens=2, verify=True)
    long = engine.submit(
        "Count to a thousand.", chat=True, max_new_tokens=400, verify=True, stop_on_eos=False, cancel=stop.is_set
    )
    for _ in short.stream():
        pass
    during = long.trace.n_generated
    stop.set()
    assert calls[:1] == [1] and during < 20, during  # checked within a step or two, not after 10 s of decoding
    assert wait_all([long], 600)


def test_a_run_that_ends_early_in_a_room_waits_for_the_room_s_check(lm, monkeypatch):
    from kvviz.engine import engine as engine_module

    calls = []
    real = engine_module.check
    monkeypatch.setattr(
        engine_module, "check", lambda lm, gens, timeout: calls.append(len(gens)) or real(lm, gens, timeout)
    )
    # 1 s alone would check the early run at once (the room's steps left, at its first step's pace, take longer);
    # beside 12 decoding runs it may wait 1 s × ROOM_WAIT = 5 s, room enough on a machine shared with other work
    engine = Engine(lm, check_wait_s=1.0, gather_s=0.5, gather_max_s=5.0)
    early = engine.submit("Say yes.", chat=True, max_new_tokens=1, verify=True)
    room = [engine.submit(f"Count to {n}.", chat=True, max_new_tokens=3, verify=True) for n in range(2, 14)]
    assert wait_all([early, *room], 600)
    assert calls == [13], calls  # one check for all, not the early run's alone first
    assert early.trace.equivalence["max_abs_logit_diff"] < 1e-3
