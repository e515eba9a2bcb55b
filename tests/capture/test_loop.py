"""Capture on the real bundled model: the invariants the chapter teaches, checked on real tensors."""

from __future__ import annotations

import numpy as np
import pytest

from kvviz.capture.attention_fn import is_installed
from kvviz.capture.loop import capture, capture_iter
from kvviz.capture.model_io import encode_prompt, model_info

pytestmark = pytest.mark.slow  # every test generates with the real model


@pytest.fixture(scope="module")
def france(lm):
    return capture(lm, "What is the capital of France?", chat=True, max_new_tokens=24, verify=True)


def test_answers_a_simple_factual_question(france):
    assert "Paris" in france.text
    assert france.stop_reason == "eos"


def test_stops_on_real_end_of_turn_not_only_the_labelled_eos(lm):
    # the GGUF tokenizer calls <|endoftext|> "unk"; both it and <|im_end|> must end generation
    vocab = lm.tokenizer.get_vocab()
    assert {vocab["<|im_end|>"], vocab["<|endoftext|>"]} <= lm.stop_ids
    assert france_text_has_no_special(lm)


def france_text_has_no_special(lm) -> bool:
    trace = capture(lm, "Say hello.", chat=True, max_new_tokens=40)
    return trace.token_ids[-1] in lm.stop_ids and "<|im_end|>" not in trace.text


def test_cache_grows_by_exactly_one_per_decode_step(france):
    lens = [s.cache_lens for s in france.steps]
    assert all(len(set(x)) == 1 for x in lens)  # every layer holds the same count
    assert lens[0][0] == france.n_prompt
    assert np.all(np.diff([x[0] for x in lens]) == 1)


def test_cache_bytes_equal_the_formula(france):
    m = france.model
    assert m.kv_bytes_per_token == 2 * 30 * 3 * 64 * 4  # SmolLM2: 30 layers, 3 KV heads, d_h 64, fp32
    for s in france.steps:
        assert s.cache_bytes == s.cache_lens[0] * m.kv_bytes_per_token


def test_cached_decoding_equals_full_recompute(france):
    eq = france.equivalence
    assert eq["positions_checked"] == france.n_generated
    assert eq["max_abs_logit_diff"] < 1e-3
    assert eq["max_abs_attn_output_diff"] < 1e-4


def test_attention_rows_sum_to_one(france):
    assert np.allclose(france.decode_rows.astype(np.float32).sum(-1), 1.0, atol=2e-3)
    assert np.allclose(france.window_rows.sum(-1), 1.0, atol=1e-5)
    # every query hands out exactly one unit of attention in total
    assert np.allclose(france.colsum.sum(-1), france.n_fed, rtol=1e-5)


def test_capture_function_is_removed_after_a_run(lm, france):
    assert not is_installed(lm.model)
    assert lm.model.config._attn_implementation == "sdpa"


def test_capture_function_is_removed_after_an_error(lm):
    def boom(cache, rec, step):
        raise RuntimeError("fault inside a step")

    with pytest.raises(RuntimeError, match="fault inside a step"):
        capture(lm, "Hello", chat=False, max_new_tokens=4, after_step=boom)
    assert not is_installed(lm.model)


def test_streams_after_prefill_and_every_step(lm):
    seen = [len(t.steps) for t in capture_iter(lm, "Once upon a time", chat=False, max_new_tokens=5)]
    assert seen == [1, 2, 3, 4, 5]  # after the prefill, each decode step, and the finished run


def test_stop_request_ends_the_run(lm):
    calls = []
    trace = capture(
        lm, "Count: 1, 2, 3,", chat=False, max_new_tokens=50, should_stop=lambda: calls.append(1) or len(calls) >= 3
    )
    assert trace.stop_reason == "stopped" and trace.n_generated == 3


def test_sampling_is_reproducible_with_a_seed(lm):
    from kvviz.capture.model_io import Sampling

    a = capture(lm, "Once upon a time", chat=False, max_new_tokens=8, sampling=Sampling(0.9, 0.9, seed=7))
    b = capture(lm, "Once upon a time", chat=False, max_new_tokens=8, sampling=Sampling(0.9, 0.9, seed=7))
    assert a.token_ids == b.token_ids


@pytest.mark.parametrize("bad", [dict(max_new_tokens=0), dict(max_new_tokens=9000)])
def test_rejects_out_of_range_requests(lm, bad):
    with pytest.raises(ValueError):
        capture(lm, "Hello", **bad)


def test_rejects_empty_prompt(lm):
    with pytest.raises(ValueError, match="empty"):
        capture(lm, "", chat=False, prompt_ids=[])


def test_chat_template_wraps_the_prompt(lm):
    ids = encode_prompt(lm, "Hi", chat=True)
    text = lm.tokenizer.decode(ids)
    assert text.startswith("<|im_start|>system") and text.rstrip().endswith("<|im_start|>assistant")


def test_trace_round_trips_through_a_file(tmp_path, france):
    from kvviz.capture.trace import Trace

    path = france.save(tmp_path / "t.npz")
    back = Trace.load(path)
    assert back.token_ids == france.token_ids and back.text == france.text
    assert np.array_equal(back.colsum, france.colsum)
    assert back.step_frame().equals(france.step_frame())


def test_trace_load_refuses_other_files(tmp_path):
    from kvviz.capture.trace import Trace

    bad = tmp_path / "x.npz"
    bad.write_bytes(b"not a trace")
    with pytest.raises(ValueError, match="Not a kvviz trace"):
        Trace.load(bad)


def test_model_info_is_read_by_the_one_config_reader(lm):
    from kvviz.memory.layout import cache_layout

    info, layout = model_info(lm), cache_layout(lm.config)
    assert (
        (info.layers, info.q_heads, info.kv_heads, info.head_dim)
        == (layout.num_layers, layout.num_attention_heads, layout.num_key_value_heads, layout.head_dim)
        == (30, 9, 3, 64)
    )
    assert info.model_type == layout.model_type == "llama" and info.attention == "GQA"
    assert info.context_length == layout.max_position_embeddings == 8192
