"""Every eviction policy, driven by the one registry: budget arithmetic, kept sets, evolution while decoding.

Unit tests run on hand-made positions and scores; the SnapKV test also checks the real model's kept
sets against votes recomputed here from transformers' own eager attention (an independent path:
no kvviz Recorder involved).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from kvviz.capture.model_io import encode_prompt
from kvviz.eviction.policies import (
    HEAVY,
    POLICIES,
    SINK,
    WINDOW,
    FullCache,
    Policy,
    PolicyState,
    field_specs,
    make_policy,
    n_kept_for,
)
from kvviz.eviction.policies.base import group_mean
from kvviz.eviction.policies.h2o import split_budget
from kvviz.eviction.policies.scorer import protect_ends, select_kept
from kvviz.eviction.policies.snapkv import snapkv_scores
from kvviz.eviction.query_stats import QueryStats
from kvviz.eviction.run import run_policy
from kvviz.examples import needle_prompt

LYR, HQ, HKV = 3, 6, 2


def rotary(x: torch.Tensor, position_ids: torch.Tensor, d: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain RoPE's cos/sin [1, P, d] (base 10,000), the shape a model's rotary embedding returns."""
    inv = 1.0 / 10000 ** (torch.arange(0, d, 2).float() / d)
    angle = position_ids[..., None].float() * inv
    angle = torch.cat([angle, angle], dim=-1)
    return angle.cos().to(x.dtype), angle.sin().to(x.dtype)


def fake_state(n: int, n_kept: int, seed: int = 0, step: int = 0, w: int = 8, d: int = 8) -> PolicyState:
    """Right after a prefill of n tokens: random attention summaries, keys, values and query statistics."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.rand(LYR, HQ, w, n, generator=g)
    rows = rows * torch.tril(torch.ones(n, n))[n - w :]  # causal: window query i sees keys ≤ its position
    rows = rows / rows.sum(-1, keepdim=True)
    a = torch.randn(LYR, HQ, d, d, generator=g)
    stats = QueryStats(
        skip=4, n=n, mean=torch.randn(LYR, HQ, d, generator=g), cov=a @ a.transpose(-1, -2) / d, rotary=rotary
    )
    return PolicyState(
        positions=torch.arange(n).expand(LYR, HKV, n).contiguous(),
        n_kept=n_kept,
        n_prompt=n,
        step=step,
        kv_heads=HKV,
        colsum=torch.rand(LYR, HQ, n + 16, generator=g) * 10,
        window_rows=rows,
        keys=torch.randn(LYR, HKV, n, d, generator=g),
        values=torch.randn(LYR, HKV, n, d, generator=g),
        query_stats=stats,
        reconstruction=torch.rand(LYR, HKV, n, generator=g),  # KVzip's largest repeat attention per entry
    )


def small(name: str) -> Policy:
    """The registry's policy with parameters that fit a 40-token toy prompt."""
    return make_policy(name, window_size=8) if name in ("snapkv", "pyramidkv", "adakv") else make_policy(name)


# ---- the registry ------------------------------------------------------------------------------
def test_registry_names_and_contract():
    assert set(POLICIES) == {
        "full",
        "streaming_llm",
        "window",
        "h2o",
        "snapkv",
        "knorm",
        "tova",
        "expected_attention",
        "pyramidkv",
        "adakv",
        "kvzip",
    }
    for name, cls in POLICIES.items():
        assert dataclasses.is_dataclass(cls) and issubclass(cls, Policy)
        assert cls.name == name and cls.title and cls.summary
        p = cls()  # every hyper-parameter has a default
        assert set(p.params()) == {f["name"] for f in field_specs(cls)}


def test_make_policy_refuses_unknown_names_and_parameters():
    with pytest.raises(ValueError, match="Unknown policy"):
        make_policy("lru")
    with pytest.raises(ValueError, match="no parameter"):
        make_policy("streaming_llm", window_size=8)


# ---- budget arithmetic -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("n", "budget", "ratio", "expected"),
    [
        (100, None, 0.3, 70),
        (10, None, 0.7, 3),
        (350, None, 0.5, 175),
        (7, None, 0.99, 1),
        (5, None, 0.0, 5),
        (100, 64, None, 64),
        (100, 100, None, 100),
        (100, 500, None, 500),
    ],
)
def test_n_kept_formula(n, budget, ratio, expected):
    assert n_kept_for(n, budget, ratio) == expected
    if ratio is not None:
        assert expected == max(1, int(n * (1 - ratio)))


@pytest.mark.parametrize(
    ("budget", "ratio"), [(None, None), (10, 0.5), (0, None), (2.5, None), (None, 1.0), (None, -0.1), (True, None)]
)
def test_bad_budgets_are_value_errors(budget, ratio):
    with pytest.raises(ValueError):
        n_kept_for(50, budget, ratio)


@pytest.mark.parametrize("name", list(POLICIES))
@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.75])
def test_every_policy_keeps_exactly_n_kept_after_prefill(name, ratio):
    n = 40
    n_kept = n_kept_for(n, ratio=ratio)
    policy = small(name)
    policy.validate(n_kept, n)
    state = fake_state(n, n_kept)
    if isinstance(policy, FullCache):
        assert not policy.wants_compression(state)
        return
    assert policy.wants_compression(state)
    sel = policy.select(state)
    assert sel.roles.shape == sel.keep.shape
    held = sel.keep >= 0  # a ragged selection pads each head's list with PAD (-1)
    counts = held.sum(-1)
    if policy.ragged:
        assert (counts.float().mean() - n_kept).abs() <= 1, "ragged budgets keep n_kept per head on average"
        assert (held.int().diff(dim=-1) <= 0).all(), "padding only after each head's kept positions"
    else:
        assert sel.keep.shape == (LYR, HKV, n_kept) and bool(held.all())
    for layer in range(LYR):
        for head in range(HKV):
            kept = sel.keep[layer, head][held[layer, head]]
            assert (kept.diff() > 0).all(), "kept positions are strictly ascending (unique)"
            assert ((kept >= 0) & (kept < n)).all()
    if sel.scores is not None:
        assert sel.scores.shape == (LYR, HKV, n)


@pytest.mark.parametrize("name", list(POLICIES))
def test_a_budget_at_least_the_prompt_evicts_nothing(name):
    n = 40
    state = fake_state(n, n_kept_for(n, budget=60))
    assert state.n_kept == 60 and not small(name).wants_compression(state)


# ---- StreamingLLM and the window ---------------------------------------------------------------
@pytest.mark.parametrize(("n", "n_kept", "sinks"), [(40, 20, 4), (40, 5, 4), (100, 64, 0), (9, 8, 2)])
def test_streaming_keeps_sinks_and_the_last_positions(n, n_kept, sinks):
    state = fake_state(n, n_kept)
    sel = make_policy("streaming_llm", sinks=sinks).select(state)
    expected = list(range(sinks)) + list(range(n - (n_kept - sinks), n))
    assert (sel.keep == torch.tensor(expected)).all(), "the same set in every layer and KV head"
    assert (sel.roles[..., :sinks] == SINK).all() and (sel.roles[..., sinks:] == WINDOW).all()


def test_streaming_evicts_while_decoding_one_token_at_a_time():
    policy = make_policy("streaming_llm", sinks=4)
    held = torch.arange(20)
    for t in range(20, 40):  # each step: the new token arrives, the oldest non-sink leaves
        state = PolicyState(
            positions=torch.cat([held, torch.tensor([t])]), n_kept=20, n_prompt=20, step=t - 19, kv_heads=1
        )
        held = policy.select(state).keep
        assert held.tolist() == [0, 1, 2, 3, *range(t - 15, t + 1)]


def test_streaming_budget_must_exceed_the_sinks():
    with pytest.raises(ValueError, match="sinks"):
        make_policy("streaming_llm", sinks=4).validate(4, 40)


def test_window_keeps_only_the_most_recent():
    sel = make_policy("window").select(fake_state(40, 10))
    assert (sel.keep == torch.arange(30, 40)).all()


# ---- SnapKV -----------------------------------------------------------------------------------
def test_snapkv_votes_by_hand():
    """One spike per query head: pooled (kernel 3, zero padding counted) and averaged per KV group."""
    n, w = 12, 4
    rows = torch.zeros(1, 4, w, n)  # 4 query heads, 2 KV heads (groups {0,1}, {2,3})
    rows[0, 0, :, 2] = 1.0  # head 0: every window query attends to position 2
    rows[0, 1, :, 5] = 1.0
    rows[0, 2, :, 0] = 1.0  # head 2 votes for position 0: zero padding halves nothing, divides by 3
    rows[0, 3, :, 7] = 1.0
    scores = snapkv_scores(rows, w, 3, "avg", kv_heads=2)  # [1, 2, 8]
    expected = torch.zeros(1, 2, 8)
    expected[0, 0, 1:4] += 1 / 3 / 2
    expected[0, 0, 4:7] += 1 / 3 / 2
    expected[0, 1, 0:2] += 1 / 3 / 2
    expected[0, 1, 6:8] += 1 / 3 / 2
    assert torch.allclose(scores, expected)
    sharp = snapkv_scores(rows * torch.tensor([1.0, 0.5, 1.0, 0.5])[None, :, None, None], w, 1, "avg", kv_heads=2)
    keep, roles = select_kept(
        torch.arange(n).expand(1, 2, n), 6, protect_ends(n, 0, WINDOW, w, WINDOW), F.pad(sharp, (0, w))
    )  # kernel 1: no smoothing, two prefix slots per KV head
    assert keep[0, 0].tolist() == [2, 5, 8, 9, 10, 11]
    assert keep[0, 1].tolist() == [0, 7, 8, 9, 10, 11]
    maxed = snapkv_scores(rows, w, 3, "max", kv_heads=2)
    assert torch.allclose(maxed[0, 0, 1:4], torch.full((3,), 0.5))


@pytest.mark.parametrize("bad", [{"kernel_size": 4}, {"pooling": "median"}, {"window_size": 0}])
def test_snapkv_refuses_bad_parameters(bad):
    with pytest.raises(ValueError):
        make_policy("snapkv", **bad).validate(100, 200)


def test_snapkv_budget_below_the_window_is_an_error():
    with pytest.raises(ValueError, match="window"):
        make_policy("snapkv").validate(40, 200)


def eager_attentions(lm, ids: list[int]) -> torch.Tensor:
    """transformers' own eager attention probabilities for every layer: [Lyr, Hq, L, L] (fp32)."""
    model = lm.model
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.inference_mode():
            out = model(input_ids=torch.tensor([ids]), output_attentions=True, use_cache=False)
    finally:
        model.set_attn_implementation(previous)
    return torch.stack([a[0] for a in out.attentions]).float()


@pytest.mark.slow
@pytest.mark.parametrize("pooling", ["avg", "max"])
def test_snapkv_on_the_model_keeps_its_window_and_the_top_pooled_votes(lm, pooling):
    ids = encode_prompt(lm, needle_prompt(2, 3), True)
    n, w, k, n_kept = len(ids), 16, 5, 48
    run = run_policy(
        lm,
        ids,
        make_policy("snapkv", window_size=w, kernel_size=k, pooling=pooling),
        budget=n_kept,
        max_new_tokens=1,
        record_history=False,
    )
    # independent votes: eager rows of the last w queries, mean, 1-D pooling, mean over each KV group
    att = eager_attentions(lm, ids)[:, :, -w:, : n - w].mean(2)  # [Lyr, Hq, L-w]
    pool = F.avg_pool1d if pooling == "avg" else F.max_pool1d
    votes = pool(att.reshape(-1, 1, n - w), k, 1, k // 2).reshape(att.shape)
    votes = votes.reshape(votes.shape[0], lm.config.num_key_value_heads, -1, n - w).mean(2).numpy()
    np.testing.assert_allclose(run.prefill_scores[..., : n - w], votes, rtol=1e-4, atol=1e-7)
    for layer in range(votes.shape[0]):
        for head in range(votes.shape[1]):
            kept = set(run.kept[layer, head].tolist())
            assert set(range(n - w, n)) <= kept, "the observation window is always kept"
            prefix = np.array(sorted(kept - set(range(n - w, n))))
            assert len(prefix) == n_kept - w
            dropped = np.setdiff1d(np.arange(n - w), prefix)
            assert votes[layer, head, prefix].min() >= votes[layer, head, dropped].max() - 1e-6


# ---- H2O ----------------------------------------------------------------------------------------
def test_split_budget():
    assert split_budget(20, 0.5) == (10, 10)
    assert split_budget(35, 0.5) == (17, 18)
    assert split_budget(10, 0.0) == (0, 10)
    assert split_budget(1, 0.9) == (0, 1)


def test_group_mean_follows_repeat_kv_order():
    x = torch.arange(6.0).reshape(6, 1)  # query heads 0..5, groups of 3
    assert group_mean(x, 2).flatten().tolist() == [1.0, 4.0]


def reference_h2o(scores: np.ndarray, held: list[int], n_kept: int, n_recent: int) -> list[int]:
    """The specification, one head, plain Python: the newest n_recent stay, the rest compete on score."""
    if len(held) <= n_kept:
        return held
    recent = held[-n_recent:]
    older = sorted(held[:-n_recent], key=lambda p: -scores[p])[: n_kept - n_recent]
    return sorted(older) + recent


def test_h2o_evolves_step_by_step_as_specified():
    """Simulate prefill + 30 decode steps with accumulating attention; compare with the plain reference."""
    n, n_kept, steps = 30, 12, 30
    policy = make_policy("h2o", heavy_fraction=0.5)
    n_heavy, n_recent = split_budget(n_kept, 0.5)
    g = torch.Generator().manual_seed(3)
    colsum = torch.zeros(LYR, HQ, n + steps)
    colsum[..., :n] = torch.rand(LYR, HQ, n, generator=g) * torch.linspace(3, 1, n)  # the prefill's column sums
    held = torch.arange(n).expand(LYR, HKV, n).contiguous()
    ref = [[list(range(n)) for _ in range(HKV)] for _ in range(LYR)]
    evicted = [[set() for _ in range(HKV)] for _ in range(LYR)]
    for step in range(steps + 1):
        if step > 0:  # a new token arrives; every held key (and itself) receives some attention
            t = n + step - 1
            held = torch.cat([held, torch.full((LYR, HKV, 1), t)], dim=-1)
            bump = torch.zeros(LYR, HQ, n + steps)
            for li in range(LYR):
                for h in range(HKV):
                    cols = held[li, h]
                    bump[li, h * 3 : (h + 1) * 3, cols] = torch.rand(3, len(cols), generator=g) / len(cols)
            colsum += bump
            for li in range(LYR):
                for h in range(HKV):
                    ref[li][h].append(t)
        state = PolicyState(positions=held, n_kept=n_kept, n_prompt=n, step=step, kv_heads=HKV, colsum=colsum)
        scores = group_mean(colsum, HKV).numpy()
        if policy.wants_compression(state):
            sel = policy.select(state)
            new_held = sel.keep
            assert (sel.roles[..., -n_recent:] == WINDOW).all() and (sel.roles[..., :n_heavy] == HEAVY).all()
        else:
            new_held = held
        for li in range(LYR):
            for h in range(HKV):
                before = held[li, h].tolist()
                ref[li][h] = reference_h2o(scores[li, h], ref[li][h], n_kept, n_recent)
                after = new_held[li, h].tolist()
                assert after == ref[li][h], f"step {step}, layer {li}, head {h}"
                assert before[-n_recent:] == after[-n_recent:], "the recent window is never evicted"
                assert not set(after) & evicted[li][h], "evicted entries never come back"
                evicted[li][h] |= set(before) - set(after)
                assert len(after) == min(len(before), n_kept)
        held = new_held


@pytest.mark.slow
def test_h2o_on_the_model_never_evicts_its_recent_window(lm):
    ids = encode_prompt(lm, "Tell me a short story about a cat who learns to fly.", True)
    n_kept = 16
    run = run_policy(lm, ids, make_policy("h2o"), budget=n_kept, max_new_tokens=6)
    n_recent = split_budget(n_kept, 0.5)[1]
    seen = len(ids)
    evicted = [[set() for _ in range(run.kept.shape[1])] for _ in range(run.kept.shape[0])]
    prev = None
    for step, held in enumerate(run.history):
        held = np.sort(held, axis=-1)  # the history is in cache-slot order
        fed = seen + step
        assert held.shape[-1] == n_kept
        assert (held[..., -n_recent:] == np.arange(fed - n_recent, fed)).all()
        if prev is not None:
            for li in range(held.shape[0]):
                for h in range(held.shape[1]):
                    now = set(held[li, h].tolist())
                    assert now <= set(prev[li, h].tolist()) | {fed - 1}
                    assert not now & evicted[li][h]
                    evicted[li][h] |= set(prev[li, h].tolist()) - now
        prev = held
    assert len({tuple(run.kept[li, h]) for li in range(run.kept.shape[0]) for h in range(run.kept.shape[1])}) > 1, (
        "H2O chooses per layer and KV head"
    )


# ---- KVzip ----------------------------------------------------------------------------------------
def test_kvzip_evicts_the_lowest_scores_over_every_layer_and_head():
    """One bottom-k over layers × heads: budgets differ per layer and head, the sinks always stay."""
    n = 10
    scores = torch.zeros(LYR, HKV, n)
    scores[0, 0] = 1.0  # layer 0, head 0 is needed everywhere
    scores[1, 1, 5:] = 0.5
    state = PolicyState(
        positions=torch.arange(n).expand(LYR, HKV, n).contiguous(),
        n_kept=5,
        n_prompt=n,
        step=0,
        kv_heads=HKV,
        reconstruction=scores + torch.linspace(0, 1e-3, n),  # ties broken towards later positions
        ratio=0.5,
    )
    sel = make_policy("kvzip", n_sink=2).select(state)
    kept = [[[p for p in head if p >= 0] for head in layer] for layer in sel.keep.tolist()]
    assert len(sum(sum(kept, []), [])) == LYR * HKV * n // 2  # int(numel × 0.5) evicted in all
    assert kept[0][0] == list(range(n)) and kept[1][1] == [0, 1, 5, 6, 7, 8, 9]
    assert all(layer_head[:2] == [0, 1] for layer in kept for layer_head in layer)  # sinks
    assert (sel.roles[..., :2] == SINK).all()
    layerwise = make_policy("kvzip", n_sink=2, layerwise=True).select(state)
    assert ((layerwise.keep >= 0).sum((-1, -2)) == HKV * n // 2).all()  # the same count in every layer
    with pytest.raises(ValueError, match="reconstruction"):
        make_policy("kvzip").select(dataclasses.replace(fake_state(40, 20), reconstruction=None))


def test_params_with_a_million_unknown_names_are_refused_in_one_step():
    import time

    from kvviz.eviction.policies import check_params

    values = {f"k{i:07d}": 1 for i in range(10**6, 0, -1)}
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="does not apply to policy 'h2o'"):
        check_params("h2o", values)
    assert time.perf_counter() - t0 < 0.05  # sorting the unknown names first took ~1 s
