"""In bf16 the equivalence check says what fp32 says: the cache changes nothing. bf16 rounding moves the logits
by half a unit (they differ by far more than fp32's 1e-3), while the model, its tokens and their ranking stay
the same; the Generate tab, ``/generate``'s summary and Learn's question read the dtype's own tolerance."""

from __future__ import annotations

import pytest
import torch

from kvviz.capture import attention_fn
from kvviz.capture.loop import capture
from kvviz.capture.recorder import Recorder
from kvviz.capture.trace import EQUIVALENCE_TOLERANCE
from kvviz.figures.generate import equivalence_text
from kvviz.lessons.questions import QUESTIONS, why_no_query_cache
from tests.tiny_models import build, tiny_config

QUESTION = "What is a KV cache? Answer in one sentence."
NEW = 8


@pytest.fixture(scope="module")
def trace16(lm16):
    return capture(lm16, QUESTION, chat=True, max_new_tokens=NEW, verify=True)


def test_bf16_rounding_is_judged_by_bf16s_tolerance(trace16):
    eq = trace16.equivalence
    assert eq["dtype"] == "bfloat16" and trace16.model.bytes_per_element == 2
    # bf16 rounding: far above fp32's fixed 1e-3, well inside the tolerance derived from bf16's precision
    assert EQUIVALENCE_TOLERANCE < 0.05 < eq["max_abs_logit_diff"] < eq["tolerance"] < 2.5
    assert eq["recomputations"] == 1  # no second recomputation to blame the capture
    n = eq["positions_checked"]
    assert n == trace16.n_generated and eq["top1_agree"] + eq["near_ties"] >= n
    assert eq["topk_agree"] + eq["near_ties"] == n  # every ranking difference a swap rounding can make


def test_the_generate_tab_says_the_cache_and_the_capture_change_nothing(trace16):
    text = equivalence_text(trace16)
    assert "**Cached decoding equals full recomputation**" in text
    assert "the cache changes nothing, and neither does the capture" in text
    assert "DIFFERS" not in text and "CHANGED" not in text
    assert "threshold" in text and "for bfloat16" in text and "greedy token agrees at" in text
    assert "a difference of 0.5 is a few rounding steps of the same model" in text


def test_generates_summary_says_the_cache_changes_nothing(trace16):
    out = trace16.summary()
    verdict = out["equivalence"]
    assert verdict["cache_changes_nothing"] is True and verdict["dtype"] == "bfloat16"
    assert out["max_abs_logit_diff_vs_recompute"] < verdict["tolerance"]
    assert verdict["greedy_tokens_agree"] is not None and verdict["top_k"] == 5


def test_learns_question_answers_the_same_logits(lm16):
    question = next(q for q in QUESTIONS if q.compute is why_no_query_cache)
    answer = why_no_query_cache(lm16)
    assert answer.values["max_abs_logit_diff"] > EQUIVALENCE_TOLERANCE and answer.values["dtype"] == "bfloat16"
    assert question.guess is not None and question.guess.read(answer.values) == "the same logits"
    assert "agrees" in answer.text and "DISAGREES" not in answer.text


def _own_outputs(monkeypatch, dtype: torch.dtype) -> tuple[list[bool], int]:
    """A tiny Llama's capture in ``dtype``: per attention call whether the SDPA shortcut computed its output
    from the recorder's probabilities, and how many calls the recorder got through the implementation."""
    lm = build({**tiny_config("llama"), "torch_dtype": str(dtype).removeprefix("torch.")}, name="tiny")
    lm.model.to(dtype)
    lm.dtype = dtype
    own: list[bool] = []
    recorded = [0]
    real_own, real_record = Recorder.own_output, attention_fn.record_call

    def counted(self, *args, **kwargs):
        out = real_own(self, *args, **kwargs)
        own.append(out is not None)
        return out

    def record(*args, **kwargs):
        recorded[0] += 1
        return real_record(*args, **kwargs)

    monkeypatch.setattr(Recorder, "own_output", counted)
    monkeypatch.setattr(attention_fn, "record_call", record)
    trace = capture(lm, "", prompt_ids=list(range(3, 20)), max_new_tokens=3, verify=True)
    assert trace.equivalence["max_abs_logit_diff"] < trace.equivalence["tolerance"]
    return own, recorded[0]


def test_the_sdpa_shortcut_is_fp32_only_and_bf16_records_through_the_implementation(monkeypatch):
    own32, recorded32 = _own_outputs(monkeypatch, torch.float32)
    assert own32 and all(own32) and recorded32 == 0
    own16, recorded16 = _own_outputs(monkeypatch, torch.bfloat16)
    assert own16 and not any(own16) and recorded16 == len(own16)  # every call recorded after SDPA computed it
