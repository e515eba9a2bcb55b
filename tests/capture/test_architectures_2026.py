"""The caches of 2025–26 models, live on tiny random-weight models: cross-layer KV sharing (Gemma-4),
DeepSeek sparse attention's indexer keys (DeepSeek-V3.2) and a linear-attention hybrid (Qwen3-Next).

Bytes are read from the cache's stored tensors after the prefill and after every decode step, and must
equal the memory calculator's formula at each; the tokens must be the model's own greedy ``generate``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvviz.capture.architectures import run_kind, tiny_config, tiny_model
from kvviz.figures import architectures as fig
from kvviz.models import CaptureError, check_capturable

PROMPT = "The KV cache"


def _own_generate(kind: str, new: int = 8) -> str:
    lm = tiny_model(kind)
    ids = torch.tensor([list(PROMPT.encode())])
    with torch.inference_mode():
        out = lm.model.generate(ids, max_new_tokens=new, do_sample=False)[0, ids.shape[1] :]
    return lm.tokenizer.decode(out.tolist())


@pytest.fixture(scope="module", params=["KV-sharing", "DSA", "linear hybrid"])
def live(request):
    return run_kind(request.param, PROMPT, max_new_tokens=8)


def test_tokens_are_the_models_own_greedy_generate(live):
    assert live.text == _own_generate(live.kind), live.kind


def test_measured_bytes_equal_the_formula_at_every_step(live):
    assert len(live.steps) == 8
    for step in live.steps:
        assert step.layer_bytes == step.formula_layer_bytes, (live.kind, step.tokens_seen)
        assert step.state_bytes == step.formula_state_bytes, (live.kind, step.tokens_seen)


def test_sharing_layers_hold_nothing_of_their_own():
    live = run_kind("KV-sharing", PROMPT)
    assert live.kv_sources == (None, None, None, 1, 2, 1)  # Gemma-4: the last producing layer of the same type
    assert {t.layer for t in live.tensors} == {0, 1, 2}  # DummyLayers: no tensors at all
    for step in live.steps:
        assert step.layer_bytes[3:] == (0, 0, 0)
        # sliding layers 0 and 2 keep window - 1 = 7 tokens, global layer 1 every token: 2 × 1 head × 16 × 4 B each
        assert step.layer_bytes[:3] == (7 * 128, step.tokens_seen * 128, 7 * 128)
    assert live.max_abs_logit_diff_vs_unpatched < 1e-4  # every layer's attention captured, shared ones included


def test_dsa_caches_one_indexer_key_per_token_and_masks_what_it_did_not_select():
    live = run_kind("DSA", PROMPT)
    cfg = tiny_config("DSA")
    index = [t for t in live.tensors if t.name == "indexer keys"]
    assert [t.shape for t in index] == [(1, 19, cfg["index_head_dim"])] * 2  # [batch, tokens, index_head_dim]
    assert sum(t.bytes for t in index) == 2 * 19 * 16 * 4
    per_step = [sum(s.layer_bytes) for s in live.steps]
    assert {b - a for a, b in zip(per_step, per_step[1:])} == {2 * (32 + 8 + 16) * 4}  # latent + RoPE + indexer
    # the capture wrapper runs SDPA under its own name, which the model would not mask for: it masks the same way
    assert live.max_abs_logit_diff_vs_unpatched < 1e-4
    assert live.index_topk == 4 < live.tokens_seen


def test_linear_layers_state_is_flat_while_full_attention_grows():
    live = run_kind("linear hybrid", PROMPT)
    states = {s.state_bytes for s in live.steps}
    conv = (2 * 2 * 8 + 4 * 8) * 4  # (2 · key heads · key dim + value heads · value dim) × conv kernel
    recurrent = 4 * 8 * 8  # value heads × key dim × value dim
    assert states == {((conv + recurrent) * 4,) * 3 + (0,)}  # fp32, the same after 12 tokens as after 19
    full = [s.layer_bytes[3] for s in live.steps]
    assert full == [n * 2 * 2 * 16 * 4 for n in range(12, 20)]  # one token's K/V per step
    assert [s.layer_bytes[:3] for s in live.steps] == [(0, 0, 0)] * 8
    with pytest.raises(CaptureError, match="linear-attention"):  # the Generate flow keeps refusing it
        check_capturable(tiny_model("linear hybrid").model)


def test_generate_refuses_layers_whose_kv_differ_in_size():
    """A Gemma-4 whose global layers have their own head size: kvviz's per-layer records assume one shape."""
    from kvviz.capture.architectures import build

    cfg = {**tiny_config("KV-sharing"), "global_head_dim": 32}
    with pytest.raises(CaptureError, match=r"K/V of different sizes \(heads × head_dim 1 × 16, 1 × 32\)"):
        build(cfg)


SUMMARIES = ("colsum", "prefill_colsum", "sink_mass", "window_rows", "prefill_map", "key_channel_absmean")


def test_hybrid_attention_is_recorded_on_its_full_attention_layers_only():
    """The capture records the full-attention layer's probabilities, equal to transformers' own eager
    ``output_attentions`` on the same tokens; the gated-DeltaNet layers have none and are NaN (absent)."""
    from kvviz.capture.architectures import build

    live = run_kind("linear hybrid", PROMPT)
    trace = live.trace
    cfg = tiny_model("linear hybrid").config
    full = tuple(i for i, kind in enumerate(cfg.layer_types) if kind == "full_attention")
    assert live.attention_layers == full == (3,) and trace.model.attention_layers == [3]
    for name in SUMMARIES:
        arr = getattr(trace, name)
        assert np.isnan(arr[:3]).all() and not np.isnan(arr[3]).any(), name
    assert np.isnan(trace.decode_rows[:, :3]).all() and not np.isnan(trace.decode_rows[:, 3]).any()
    assert np.isnan(trace.key_norms[:3]).all() and not np.isnan(trace.key_norms[3, :, : trace.n_fed]).any()
    n = trace.n_prompt
    prompt_rows = trace.window_rows[3]  # [Hq, W, L]: with a 12-token prompt, every prompt query's row
    assert prompt_rows.shape == (4, n, n)
    np.testing.assert_allclose(prompt_rows.sum(-1), 1, atol=1e-5)
    decode = trace.decode_rows[:, 3].astype(np.float32)  # [S, Hq, T] (bin 1), fp16 in the trace
    np.testing.assert_allclose(decode.sum(-1), 1, atol=2e-3)
    eager = build(tiny_config("linear hybrid"), attn_implementation="eager", state_layers=True)  # same seed
    ids = torch.tensor([trace.token_ids[: trace.n_fed]])
    with torch.inference_mode():
        attentions = eager.model(input_ids=ids, output_attentions=True).attentions
    assert len(attentions) == len(full)  # transformers returns the attention layers' probabilities only
    ref = attentions[0][0].numpy()  # [Hq, T, T]
    np.testing.assert_allclose(prompt_rows, ref[:, :n, :n], atol=1e-6)
    assert np.all(decode[..., trace.n_fed :] == 0)  # the trace's last column: the final token, never fed
    np.testing.assert_allclose(decode[..., : trace.n_fed], ref[:, n:].transpose(1, 0, 2), atol=1e-3)
    np.testing.assert_allclose(trace.colsum[3, :, : trace.n_fed], ref.sum(1), atol=1e-5)


def _bars(chart) -> dict[str, list[int]]:
    return {t.name: list(t.y) for t in chart.data}


def test_the_linear_hybrid_s_fixed_state_is_counted_in_the_bars_and_the_headline():
    """The gated-DeltaNet layers' state has a fixed size, not no size: 3 × 2,048 B beside the full layer's K/V."""
    live = run_kind("linear hybrid", PROMPT)
    bars = _bars(fig.bytes_chart(live))
    state = bars["measured: fixed state (conv + recurrent)"]
    assert state == [2048, 2048, 2048, 0] and bars["measured: K/V (cache tensors)"] == [0, 0, 0, 19 * 256]
    assert bars["formula (memory calculator)"] == [2048, 2048, 2048, 19 * 256]
    assert live.cache_bytes == live.formula_cache_bytes == 3 * 2048 + 19 * 256 == 11_008
    text = fig.summary_markdown(live)
    assert "Cache measured from its tensors: **11,008 B = 10.8 KiB** (4,864 B that grow" in text
    assert "the formula: **11,008 B**" in text
    # the per-token formula totals only what grows; the state's own term totals its fixed bytes
    assert "formula 1 full layer × 2 × 2 KV heads × 16 × 4 B = 256 B;" in text
    assert "plus **6,144 B** fixed whatever the length, formula 3 state layers × 512 elements × 4 B = 6,144 B." in text


def test_the_sharing_sentence_names_the_layers_that_grow_from_the_measured_bytes():
    live = run_kind("KV-sharing", PROMPT)
    assert live.growing_layers == (1,)  # layers 0 and 2 are 8-token windows: 7 tokens held from the first step
    text = fig.summary_markdown(live)
    assert "3 of 6 layers grow" not in text
    assert (
        "only layer 1 of the 6 grows with the context (measured step by step); layers 0, 2 stay flat at 896 B each "
        "(their sliding window); layers 3, 4, 5 hold nothing." in text
    )
    # a prompt shorter than the window: the sliding layers grow until it fills, then only layer 1 does
    short = run_kind("KV-sharing", "KV", max_new_tokens=3)
    assert short.growing_layers == (0, 1, 2) and "only layers 0, 1, 2 of the 6 grow" in fig.summary_markdown(short)


def test_dsa_s_indexer_keys_are_their_own_bar_segment():
    live = run_kind("DSA", PROMPT)
    bars = _bars(fig.bytes_chart(live))
    assert bars["measured: indexer keys"] == [19 * 16 * 4] * 2 and sum(bars["measured: indexer keys"]) == 2432
    assert bars["measured: latent + RoPE key"] == [19 * (32 + 8) * 4] * 2
    assert [a + b for a, b in zip(bars["measured: latent + RoPE key"], bars["measured: indexer keys"])] == list(
        live.layer_bytes
    )
    stacked = [t for t in fig.bytes_chart(live).data if t.offsetgroup == "measured"]
    assert list(stacked[1].base) == list(stacked[0].y)  # stacked on the latent, not beside it
