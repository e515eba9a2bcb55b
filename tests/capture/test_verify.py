"""The equivalence check: one recomputation by the model as loaded settles it when it agrees; a
disagreement, or a model whose attention outputs cannot be read, gets the capture's recomputation too."""

from __future__ import annotations

import threading

import pytest
import torch

from kvviz.capture import verify as verify
from kvviz.capture.attention_fn import installed, is_installed
from kvviz.capture.drive import drive
from kvviz.capture.generation import Generation
from kvviz.capture.options import Decode, Feed, Recording, options
from kvviz.examples import CHAT_QUESTION
from tests.tiny_models import tiny_model


def finished(lm, prompt: str, n: int = 6, **kwargs) -> Generation:
    """A checked run driven to its end, its recorder and logits kept for the check."""
    g = drive(
        lm, Generation(lm, prompt, **options(chat=False, max_new_tokens=n, verify=True, stop_on_eos=False, **kwargs))
    )
    g.finish()
    return g


@pytest.fixture(scope="module")
def runs(lm):
    return [finished(lm, CHAT_QUESTION), finished(lm, "The capital of France is", 4), finished(lm, "Once upon a time")]


def test_one_recomputation_reads_the_attention_outputs_the_capture_would(lm, runs):
    g = runs[0]
    eq = verify.check(lm, [g])[0]
    assert eq["recomputations"] == 1 and eq["unpatched_reference"] is True
    assert eq["positions_checked"] == 6
    assert eq["max_abs_logit_diff"] == eq["max_abs_logit_diff_vs_unpatched"] < 1e-3
    with torch.inference_mode(), installed(lm.model):
        through = verify.recompute(lm, [g])[0]
    # the hook on each output projection reads what the capture's recomputation hands the recorder
    assert abs(eq["max_abs_attn_output_diff"] - through["max_abs_attn_output_diff"]) < 1e-5
    assert eq["max_abs_attn_output_diff"] < 1e-4
    assert not is_installed(lm.model)
    assert all(not m._forward_pre_hooks for m in lm.model.modules())  # the hooks are gone


def test_runs_checked_together_equal_runs_checked_alone(lm, runs):
    together = verify.check(lm, runs)
    for g, eq in zip(runs, together):
        alone = verify.check(lm, [g])[0]
        assert eq["positions_checked"] == alone["positions_checked"]
        assert abs(eq["max_abs_logit_diff"] - alone["max_abs_logit_diff"]) < 1e-4
        assert abs(eq["max_abs_attn_output_diff"] - alone["max_abs_attn_output_diff"]) < 1e-5


def test_runs_checked_together_read_the_output_head_once(lm, runs):
    calls = []
    handle = lm.model.get_output_embeddings().register_forward_hook(lambda _m, args, _out: calls.append(args[0].shape))
    try:
        verify.check(lm, runs)
    finally:
        handle.remove()
    # one product over every run's checked rows: per run, the head's weight would be read again for a few rows
    assert calls == [torch.Size([sum(len(g.logits_seen) for g in runs), lm.model.config.hidden_size])]


def test_shared_prefix_stops_short_of_every_checked_row():
    assert verify.shared_prefix([list(range(20)), list(range(20)) + [7]], [4, 4]) == 16
    assert verify.shared_prefix([list(range(20)), list(range(10)) + [99] * 10], [2, 2]) == 10
    assert verify.shared_prefix([list(range(20)), [5] + list(range(19))], [2, 2]) == 0  # no common start
    assert verify.shared_prefix([list(range(20))], [2]) == 0  # one run: nothing to share
    assert verify.shared_prefix([list(range(12)), list(range(12))], [6, 6]) == 0  # under MIN_SHARED


def test_chat_runs_checked_together_share_their_system_prompt_and_equal_runs_checked_alone(lm):
    room = [
        Generation(
            lm,
            q,
            feed=Feed(chat=True),
            decode=Decode(max_new_tokens=5, stop_on_eos=False),
            recording=Recording(verify=True),
        )
        for q in ("Name a colour.", "What is two plus two?", "Say hello in French, please.")
    ]
    for g in room:
        drive(lm, g).finish()
    together = verify.check(lm, room)
    feeds = [g.trace.token_ids[: g.trace.n_fed] for g in room]
    common = next(i for i in range(len(feeds[0])) if len({f[i] for f in feeds}) > 1)
    for g, eq in zip(room, together):
        alone = verify.check(lm, [g])[0]
        assert eq["shared_prefix_tokens"] == common >= verify.MIN_SHARED and alone["shared_prefix_tokens"] == 0
        assert eq["recomputations"] == 1 and eq["max_abs_logit_diff"] < 1e-3
        assert abs(eq["max_abs_logit_diff"] - alone["max_abs_logit_diff"]) < 1e-4
        assert abs(eq["max_abs_attn_output_diff"] - alone["max_abs_attn_output_diff"]) < 1e-5
    # a wrong cached logit in one run of the shared batch is caught in that run only
    room[1].logits_seen[2] = room[1].logits_seen[2] + 0.5
    caught = verify.check(lm, room)
    assert [eq["max_abs_logit_diff"] > 0.4 for eq in caught] == [False, True, False]


def test_a_wrong_cached_logit_is_caught_and_attributed(lm):
    g = finished(lm, "The capital of France is", 3)
    g.logits_seen[1] = g.logits_seen[1] + 0.5
    eq = verify.check(lm, [g])[0]
    assert eq["recomputations"] == 2  # the disagreement was attributed by the capture's recomputation
    assert eq["max_abs_logit_diff"] > 0.4 and eq["max_abs_logit_diff_vs_unpatched"] > 0.4


def test_a_wrong_attention_output_is_caught(lm):
    g = finished(lm, "The capital of France is", 3)
    assert g.rec is not None
    g.rec.outputs[-1] = g.rec.outputs[-1] + 0.25  # the last decode step's outputs, every layer
    eq = verify.check(lm, [g])[0]
    assert eq["max_abs_logit_diff"] < 1e-3 and eq["max_abs_attn_output_diff"] > 0.2


def test_without_a_readable_projection_the_capture_recomputes_the_outputs(monkeypatch):
    lm = tiny_model("gpt2")
    g = finished(lm, "", 3, prompt_ids=list(range(100, 110)))
    read = verify.check(lm, [g])[0]
    monkeypatch.setattr(verify, "PROJECTIONS", ())
    assert verify.output_projections(lm.model) == {}
    fallback = verify.check(lm, [g])[0]
    assert read["recomputations"] == 1 and fallback["recomputations"] == 2
    assert fallback["max_abs_attn_output_diff"] is not None
    assert abs(read["max_abs_attn_output_diff"] - fallback["max_abs_attn_output_diff"]) < 1e-5


def test_forwards_of_other_threads_on_the_shared_model_do_not_reach_the_check(lm, runs):
    alone = verify.check(lm, runs[:1])[0]
    stop = threading.Event()

    def other_user() -> None:  # e.g. a demo computing in another session while the engine checks
        ids = torch.tensor([[1, 2, 3, 4]])
        with torch.inference_mode():
            while not stop.is_set():
                lm.model(input_ids=ids)

    thread = threading.Thread(target=other_user)
    thread.start()
    try:
        for _ in range(3):
            eq = verify.check(lm, runs[:1])[0]
            assert eq["recomputations"] == 1
            assert abs(eq["max_abs_attn_output_diff"] - alone["max_abs_attn_output_diff"]) < 1e-6
            eq = verify.check(lm, runs)[0]  # the padded batch too
            assert eq["recomputations"] == 1
    finally:
        stop.set()
        thread.join()
