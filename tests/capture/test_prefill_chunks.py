"""A prompt fed in chunks over the cache records what one forward over the whole prompt records.

Each chunk attends to the cache the earlier ones left, at its own absolute positions; the Trace's
arrays, tokens and logits must not notice (fp32 rounding aside), sliding-window layers included
(their later chunks see only the window's keys), and the run reports how far the prefill got.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvviz.capture.loop import capture
from kvviz.capture.model_io import Progress
from kvviz.capture.trace import _ARRAYS
from kvviz.quant.cache import cache_factory
from kvviz.quant.schemes import kivi
from tests.tiny_models import tiny_model


def chunked_and_whole(lm, ids, chunk):
    seen: list[Progress] = []
    whole = capture(lm, "", chat=False, prompt_ids=ids, max_new_tokens=4, verify=True, prefill_chunk=0)
    parts = capture(
        lm, "", chat=False, prompt_ids=ids, max_new_tokens=4, verify=True, prefill_chunk=chunk, progress=seen.append
    )
    return whole, parts, seen


def assert_same_trace(whole, parts, atol):
    assert parts.token_ids == whole.token_ids
    assert [s.cache_lens for s in parts.steps] == [s.cache_lens for s in whole.steps]
    assert [s.layer_bytes for s in parts.steps] == [s.layer_bytes for s in whole.steps]
    for name in _ARRAYS:
        a, b = getattr(whole, name), getattr(parts, name)
        assert (a is None) == (b is None), name
        if a is not None:
            tol = 2e-3 if a.dtype == np.float16 else atol  # the display maps are stored in fp16
            np.testing.assert_allclose(b.astype(np.float64), a.astype(np.float64), atol=tol, err_msg=name)
    # the chunked run's logits at every generated position against one uncached forward of the whole sequence
    assert parts.equivalence["max_abs_logit_diff"] < 1e-3
    out_diff = parts.equivalence["max_abs_attn_output_diff"]  # None where legacy attention hands over no output
    assert (out_diff is None) == (whole.equivalence["max_abs_attn_output_diff"] is None)
    assert out_diff is None or out_diff < 1e-4
    assert parts.equivalence["max_abs_logit_diff_vs_unpatched"] < 1e-3


def test_the_real_model_records_the_same_in_chunks_and_says_how_far_it_got(lm):
    ids = lm.tokenizer("The cache holds every key and value the model has written so far. " * 20)["input_ids"][:250]
    whole, parts, seen = chunked_and_whole(lm, ids, 96)
    assert_same_trace(whole, parts, atol=2e-4)
    assert [p.done for p in seen if p.phase == "prefill"] == [0, 96, 192, 250]
    assert all(p.total == 250 for p in seen if p.phase == "prefill")
    assert seen[-1] == Progress("verify", 0, 1)  # the check says it runs


@pytest.mark.parametrize("name", ["mistral", "gemma2", "gpt_oss", "falcon"])
def test_sliding_windows_sinks_and_legacy_attention_record_the_same_in_chunks(name):
    # a window of 8 and chunks of 7: later chunks see only the window's keys, which start past position 0
    whole, parts, _ = chunked_and_whole(tiny_model(name), list(range(100, 160)), 7)
    assert_same_trace(whole, parts, atol=1e-5)


def test_a_custom_cache_keeps_one_prefill_forward_unless_asked(lm):
    # a quantized cache stores a forward's own tokens exactly: chunking would change its answer
    seen: list[Progress] = []
    ids = lm.tokenizer("Tell me a story about the sea. " * 10)["input_ids"]
    capture(
        lm, "", chat=False, prompt_ids=ids, max_new_tokens=1, cache_factory=cache_factory(kivi(2)), progress=seen.append
    )
    assert [p.done for p in seen] == [0, len(ids)]


def test_a_negative_chunk_is_refused(lm):
    with pytest.raises(ValueError, match="prefill_chunk"):
        capture(lm, "Hi", chat=False, max_new_tokens=1, prefill_chunk=-1)
