"""The evicting cache really drops entries (per KV head), its bytes shrink, and `full` equals plain generation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import Gemma2Config, MistralConfig
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from kvviz.capture.drive import drive
from kvviz.capture.generation import Generation
from kvviz.capture.loop import capture
from kvviz.capture.model_io import encode_prompt, forward
from kvviz.capture.options import Decode, Feed, Recording
from kvviz.eviction.cache import EvictingCache, KeyRerotator
from kvviz.eviction.policies import POLICIES, make_policy
from kvviz.eviction.run import Evictor, run_policy

PROMPT = "List three uses of a paperclip, one per line."
N_NEW = 6


@pytest.fixture(scope="module")
def ids(lm):
    return encode_prompt(lm, PROMPT, True)


def _params(name: str) -> dict:
    return {"window_size": 8} if name in ("snapkv", "pyramidkv", "adakv") else {}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(POLICIES))
def test_cache_holds_n_kept_plus_generated_and_bytes_follow(lm, ids, name):
    """After every step each layer and KV head holds exactly what the policy promises, bytes = entries × formula."""
    policy = make_policy(name, **_params(name))
    n_kept = 20
    run = run_policy(lm, ids, policy, budget=n_kept, max_new_tokens=N_NEW)
    per_token = run.kv_bytes_per_token
    assert len(run.history) == len(run.generated_ids)  # prefill + one step per fed token
    per_entry = per_token // 90  # one layer and KV head
    for step, held in enumerate(run.history):
        if policy.ragged:  # per-layer (PyramidKV) or per-head (AdaKV) budgets, each layer padded to its fullest head
            counts = (held >= 0).sum(-1)  # [Lyr, Hkv]
            assert (counts == run.kept_counts() + step).all(), f"step {step}: one new entry per head"
            assert run.step_bytes[step] == int(counts.max(-1).sum()) * 3 * per_entry
            continue
        if name == "full":
            expected = len(ids) + step
        elif policy.evicts_while_decoding:
            expected = n_kept
        else:  # SnapKV: compressed once, then grows
            expected = n_kept + step
        assert held.shape == (30, 3, expected), f"step {step}"
        assert run.step_bytes[step] == expected * per_token, "bytes measured from the tensors"
    if name == "full":
        assert run.cache_bytes == run.full_cache_bytes
    else:
        assert run.cache_bytes < run.full_cache_bytes
    counts = run.kept_counts()
    if name == "adakv":  # the layer's budget shared out among its heads
        assert (counts.sum(-1) == 3 * n_kept).all() and run.held_bytes == 90 * n_kept * per_entry
    if name == "pyramidkv":  # one budget per layer, shrinking with depth, the same total
        assert (counts == counts[:, :1]).all() and counts[0, 0] >= counts[-1, 0]
        assert abs(counts.mean() - n_kept) <= 1


@pytest.mark.slow
def test_full_policy_equals_plain_generation(lm, ids):
    plain = capture(lm, PROMPT, chat=True, max_new_tokens=8)
    ours = run_policy(lm, ids, make_policy("full"), max_new_tokens=8)
    assert ours.generated_ids == plain.token_ids[plain.n_prompt :]
    assert ours.text == plain.text


@pytest.mark.parametrize("tail", [0, 3], ids=["whole-prompt", "question-fed-after"])
def test_full_policy_gives_the_generation_loops_tokens_and_logprobs(lm, ids, tail):
    """``run_policy`` with nothing evicted = a plain run of the generation loop, distribution by distribution."""
    g = drive(
        lm,
        Generation(
            lm,
            PROMPT,
            feed=Feed(prompt_ids=ids),
            decode=Decode(max_new_tokens=N_NEW),
            recording=Recording(keep_logprobs=True),
        ),
    )
    run = run_policy(lm, ids, make_policy("full"), n_compress=len(ids) - tail, max_new_tokens=N_NEW, keep_logprobs=True)
    assert run.generated_ids == g.trace.token_ids[len(ids) :] and run.stop_reason == g.trace.stop_reason
    assert run.tokens == g.trace.tokens and run.text == g.trace.text
    assert run.logprobs is not None and np.allclose(run.logprobs, torch.stack(g.logprobs).numpy(), atol=1e-4)


def test_per_head_kept_sets_are_gathered_from_the_original_tensors(lm, ids):
    cache = EvictingCache(lm.config)
    with torch.inference_mode():
        forward(lm, ids, 0, cache, None)
    before = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
    bytes_before = cache.nbytes()
    n = len(ids)
    g = torch.Generator().manual_seed(0)
    keep = torch.stack(
        [torch.stack([torch.randperm(n, generator=g)[:7].sort().values for _ in range(3)]) for _ in range(30)]
    )  # [30, 3, 7]: a different set per layer and KV head
    cache.keep(keep)
    assert torch.equal(cache.positions(), keep)
    for li, layer in enumerate(cache.layers):
        assert layer.keys.shape == (1, 3, 7, 64) and layer.keys.is_contiguous()
        for h in range(3):
            assert torch.equal(layer.keys[0, h], before[li][0][0, h, keep[li, h]])
            assert torch.equal(layer.values[0, h], before[li][1][0, h, keep[li, h]])
    assert cache.nbytes() == bytes_before * 7 // n
    assert cache.get_seq_length() == 7 and cache.get_mask_sizes(1, 0) == (8, 0)
    with pytest.raises(ValueError, match="never come back"):
        cache.keep(torch.zeros(30, 3, 1, dtype=torch.long) + int(np.setdiff1d(np.arange(n), keep[0, 0])[0]))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["streaming_llm", "h2o"])
def test_slot_reuse_while_decoding_equals_gathering_new_tensors(lm, ids, name):
    """The in-place path (refill the evicted slot) gives the same tokens and kept sets as fresh gathers."""
    policy = make_policy(name)
    results = []
    for reuse in (True, False):
        ev = Evictor(lm, policy, 14, len(ids))
        trace = capture(
            lm,
            PROMPT,
            chat=True,
            max_new_tokens=N_NEW,
            cfg=ev.recorder_config(),
            after_step=ev.after_step,
            cache_factory=lambda lm, reuse=reuse: EvictingCache(lm.config, reuse_slots=reuse),
        )
        results.append((trace.token_ids, [np.sort(h, axis=-1) for h in ev.history], ev.history[-1]))
    (tok_a, held_a, slots_a), (tok_b, held_b, slots_b) = results
    assert tok_a == tok_b
    assert all(np.array_equal(a, b) for a, b in zip(held_a, held_b))
    assert not np.array_equal(slots_a, np.sort(slots_a, axis=-1)), "reused slots are out of position order"
    assert np.array_equal(slots_b, np.sort(slots_b, axis=-1))


@pytest.mark.slow
def test_decoding_on_a_compressed_cache_maps_attention_to_original_positions(lm, ids):
    """The Recorder's colsum lands on kept positions only: entries evicted after the prefill receive no decode
    attention in the query heads of their KV head, every decode row's mass lands on held ones."""
    ev = Evictor(lm, make_policy("h2o"), 12, len(ids))
    trace = capture(
        lm,
        PROMPT,
        chat=True,
        max_new_tokens=N_NEW,
        cache_factory=ev.cache_factory,
        after_step=ev.after_step,
        cfg=ev.recorder_config(),
    )
    decoded = trace.colsum[:, :, : len(ids)] - trace.prefill_colsum  # [Lyr, Hq, L]: decode queries' attention
    group = trace.model.group_size
    kept = ev.history[0]  # [Lyr, Hkv, 12] held after the prefill's compression
    assert kept.shape[-1] == 12 and len(trace.steps) == N_NEW
    for layer in range(kept.shape[0]):
        for kv in range(kept.shape[1]):
            gone = sorted(set(range(len(ids))) - set(kept[layer, kv].tolist()))
            rows = decoded[layer, kv * group : (kv + 1) * group]
            assert gone and np.all(rows[:, gone] == 0), f"layer {layer}, KV head {kv}: evicted positions got attention"
    per_head = trace.colsum.sum(-1) - trace.prefill_colsum.sum(-1)  # [Lyr, Hq]: one unit per decode query
    assert np.allclose(per_head, N_NEW - 1, atol=1e-3)


@pytest.mark.slow
def test_capture_iter_hooks_give_the_same_answer_as_run_policy(lm, ids):
    """Plugging the Evictor into capture_iter (cache_factory + after_step) evicts exactly like run_policy."""
    policy = make_policy("snapkv", window_size=8)
    ev = Evictor(lm, policy, 16, len(ids))
    trace = capture(
        lm,
        PROMPT,
        chat=True,
        max_new_tokens=N_NEW,
        cache_factory=ev.cache_factory,
        after_step=ev.after_step,
        cfg=ev.recorder_config(),
    )
    ours = run_policy(lm, ids, policy, budget=16, max_new_tokens=N_NEW)
    assert trace.token_ids[trace.n_prompt :] == ours.generated_ids
    assert [s.cache_lens[0] for s in trace.steps] == [16 + i for i in range(len(trace.steps))]
    assert np.array_equal(ev.kept, ours.kept)
    assert np.isnan(trace.key_norms[:, :, : len(ids) - 8]).any(), "evicted keys are absent from the final cache"


def test_key_rerotation_equals_rotating_at_the_new_position(lm):
    rot = KeyRerotator.from_model(lm.model)
    g = torch.Generator().manual_seed(1)
    raw = torch.randn(1, 3, 5, 64, generator=g)
    old = torch.tensor([[40, 41, 90, 91, 92]])
    new = torch.tensor([[0, 1, 2, 3, 4]])
    emb = lm.model.model.rotary_emb
    cos_o, sin_o = emb(raw, old)
    cos_n, sin_n = emb(raw, new)
    at_old, _ = apply_rotary_pos_emb(raw, raw, cos_o, sin_o)
    at_new, _ = apply_rotary_pos_emb(raw, raw, cos_n, sin_n)
    moved = rot.rotate(at_old, (new - old).expand(3, 5))
    assert torch.allclose(moved, at_new, atol=1e-4)


@pytest.mark.slow
def test_streaming_with_repositioning_runs_and_matches_full_when_nothing_is_evicted(lm, ids):
    policy = make_policy("streaming_llm", reposition=True)
    same = run_policy(lm, ids, policy, budget=len(ids) + N_NEW, max_new_tokens=N_NEW)
    full = run_policy(lm, ids, make_policy("full"), max_new_tokens=N_NEW)
    assert same.generated_ids == full.generated_ids
    squeezed = run_policy(lm, ids, policy, budget=12, max_new_tokens=N_NEW)
    assert squeezed.history[-1].shape[-1] == 12 and squeezed.position_mode.startswith("re-positioned")
    layer = squeezed.history[-1][0, 0]
    assert layer[:4].tolist() == [0, 1, 2, 3], "sinks stay at slots 0..3"
    with pytest.raises(ValueError, match="cache-slot positions"):
        Evictor(lm, policy, 12, len(ids)).cache_factory(lm)  # capture_iter's absolute positions cannot re-position


@pytest.mark.parametrize(
    "config",
    [
        MistralConfig(
            num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, sliding_window=8
        ),
        Gemma2Config(
            num_hidden_layers=2,
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            sliding_window=8,
            layer_types=["sliding_attention", "full_attention"],
        ),
    ],
    ids=["mistral-sliding", "gemma2-hybrid"],
)
def test_sliding_window_models_are_refused(config):
    with pytest.raises(ValueError, match="full attention"):
        EvictingCache(config)
