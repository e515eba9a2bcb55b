"""Quantization and no-cache figures are pure functions of plain data, each with a caption."""

from __future__ import annotations

import numpy as np
import torch

from kvviz.figures import nocache as nfig
from kvviz.figures import quant as qfig
from kvviz.lessons.nocache import CacheComparison, Run
from kvviz.quant.model import QKV, evaluate
from kvviz.quant.schemes import kivi, preset_schemes


def small_qkv() -> QKV:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, h, 64, 16, generator=g) for h in (4, 2, 2))  # [Lyr, H, T, D]
    return QKV([f"t{i}" for i in range(64)], q, k, v, 0.25)


def test_quant_figures():
    qkv = small_qkv()
    results = [evaluate(qkv, s) for s in (preset_schemes(16, 16)[5], kivi(2, 16, 16))]
    errors = qfig.error_bars(results)
    assert [t.name for t in errors.data] == ["keys", "values", "attention output"]
    assert errors.layout.yaxis.type == "log"
    assert list(qfig.bytes_bars(results).data[0].y) == [r.total_bytes / 1024 for r in results]
    assert len(qfig.layer_errors(results).data) == 2
    mag = np.abs(np.random.default_rng(0).normal(size=(16, 1200)))
    heat = qfig.magnitude_map(mag, [str(i) for i in range(1200)], "keys", 1, 0)
    assert np.asarray(heat.data[0].z).shape[1] <= qfig.MAX_COLUMNS  # long prompts are pooled before drawing
    assert all(c.endswith(".") or c.endswith(")") for c in qfig.CAPTIONS.values())


def test_nocache_figures():
    cached = Run(True, [1, 2, 3], [0.5, 0.1, 0.1], [10, 1, 1])
    uncached = Run(False, [1, 2, 3], [0.5, 0.6, 0.7], [10, 11, 12])
    cmp = CacheComparison(10, 3, cached, uncached)
    assert list(nfig.passes_vs_n(cmp).data[0].y) == [10, 21, 33]
    assert abs(cmp.speedup - 1.8 / 0.7) < 1e-9
    assert "1,501,500" in nfig.chapter_text() and "750.75×" in nfig.chapter_text()
    assert "N" in nfig.time_vs_n(cmp).layout.xaxis.title.text


def test_values_story_leads_with_the_output_error_and_explains_the_other_measure():
    """The app's 2-bit numbers: V error favours per channel (36.2 % vs 41.2 %), the attention output favours
    per token (51.3 % vs 77.6 %); the story must lead with the output and say why the V error disagrees."""
    from types import SimpleNamespace as R

    tok, ch, both = R(value_error=0.412), R(output_error=0.513), R(value_error=0.362, output_error=0.776)
    text = qfig.values_story(tok, ch, both)
    assert text.startswith("**Values at 2 bits, judged by the attention output**")
    assert text.index("**51.3 %** vs per channel **77.6 %**") < text.index("per channel 36.2 % vs per token 41.2 %")
    assert "points the other way" in text and "counts every entry alike" in text and "as KIVI chooses" in text
    agree = qfig.values_story(R(value_error=0.30), ch, both)
    assert "points the other way" not in agree and "per token 30.0 %, per channel 36.2 %" in agree
    assert "not supported here" in qfig.values_story(tok, R(output_error=0.9), both)
    # a ≈ 50 % output error beside a right answer: the sentence that reconciles them, beside the agreement chart
    assert "off by about half" in qfig.OUTPUT_VS_ANSWER and "residual stream" in qfig.OUTPUT_VS_ANSWER
    assert "off by about half" in qfig.CAPTIONS["agreement"]
