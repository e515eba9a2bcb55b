"""The equivalence tolerance per dtype and the ranking agreement, on hand-made logits (no model)."""

from __future__ import annotations

import math

import pytest
import torch

from kvviz.capture.attention_math import agree
from kvviz.capture.tolerance import agreement, logit_tolerance, output_tolerance
from kvviz.capture.trace import EQUIVALENCE_TOLERANCE
from kvviz.models import CaptureError


def test_fp32_keeps_its_threshold_and_bf16_gets_one_from_its_precision():
    assert logit_tolerance(torch.float32, 36.5, 30) == EQUIVALENCE_TOLERANCE == 1e-3
    # SmolLM2 in bf16: √30 layers × 2⁻⁷ × a largest |logit| of 36.5
    assert logit_tolerance(torch.bfloat16, 36.5, 30) == pytest.approx(math.sqrt(30) * 2**-7 * 36.5)
    assert 1.0 < logit_tolerance(torch.bfloat16, 36.5, 30) < 2.0  # above the 0.56–0.81 bf16 rounding measured
    assert logit_tolerance(torch.float16, 36.5, 30) == pytest.approx(logit_tolerance(torch.bfloat16, 36.5, 30) / 8)
    assert logit_tolerance(torch.bfloat16, 72, 30) == pytest.approx(2 * logit_tolerance(torch.bfloat16, 36, 30))


def test_an_attention_output_is_checked_to_a_few_roundings_of_its_dtype():
    assert output_tolerance(torch.float32) == 1e-3
    assert output_tolerance(torch.bfloat16) == 4 * 2**-7 and output_tolerance(torch.float16) == 4 * 2**-10
    ref = torch.randn(3, 5, 64, generator=torch.Generator().manual_seed(0))
    agree(0, ref.bfloat16().float(), ref, torch.bfloat16, "bf16 rounding")  # one rounding passes
    with pytest.raises(CaptureError, match="faithfully"):
        agree(0, ref * 1.1, ref, torch.bfloat16, "a 10 % error")


def _logits(n: int = 4, vocab: int = 21) -> torch.Tensor:
    base = torch.linspace(-20, 20, vocab)
    return torch.stack([base.roll(3 * i) for i in range(n)])  # every position a clear ranking, 2 apart


def test_identical_rankings_agree_everywhere():
    full = _logits()
    out = agreement(full, full.clone(), torch.bfloat16, 30)
    assert (out["top1_agree"], out["topk_agree"], out["near_ties"], out["top_k"]) == (4, 4, 0, 5)
    assert out["dtype"] == "bfloat16" and out["logit_scale"] == 20 and out["tolerance"] > 0.5


def test_a_swap_closer_than_the_tolerance_is_a_near_tie_and_a_changed_winner_is_not():
    full = _logits()
    top = full[0].topk(2).indices
    full[0, top[1]] = full[0, top[0]] - 0.25  # position 0: two candidates a bf16 rounding step apart
    cached = full.clone()
    cached[0, top[1]] += 0.5  # rounding swaps them
    cached[2, full[2].argmax()] -= 10  # a cache bug at position 2: the winner loses by far
    out = agreement(full, cached, torch.bfloat16, 30)
    assert out["tolerance"] < 2  # the clear ranking's steps of 2 are no coin toss
    assert out["top1_agree"] == 2 and out["topk_agree"] == 2 and out["near_ties"] == 1
