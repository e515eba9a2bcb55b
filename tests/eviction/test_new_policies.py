"""KNorm, TOVA, ExpectedAttention, PyramidKV and AdaKV on hand-made states, and the ragged evicting cache.

Each policy's rule is recomputed here by a different route than its module takes (loops, explicit
rotation matrices); kvpress parity on the real model is tests/eviction/test_kvpress_parity.py.
"""

from __future__ import annotations

import math

import pytest
import torch

from kvviz.eviction.policies import PAD, SINK, WINDOW, make_policy
from kvviz.eviction.policies.adakv import adakv_keep_mask
from kvviz.eviction.policies.pyramidkv import layer_budgets
from kvviz.eviction.query_stats import QueryStats
from tests.eviction.test_policies import HKV, HQ, LYR, fake_state, rotary


def test_knorm_keeps_the_smallest_key_norms_per_head():
    state = fake_state(30, 10)
    sel = make_policy("knorm").select(state)
    norms = state.keys.norm(dim=-1)  # [Lyr, Hkv, n]
    for layer in range(LYR):
        for head in range(HKV):
            expected = sorted(norms[layer, head].argsort()[:10].tolist())
            assert sel.keep[layer, head].tolist() == expected


def test_tova_keeps_one_set_per_layer_from_the_last_querys_mean_attention():
    state = fake_state(30, 10)
    sel = make_policy("tova").select(state)
    for layer in range(LYR):
        last = state.window_rows[layer, :, -1]  # [Hq, n]
        mean = [sum(float(last[h, p]) for h in range(HQ)) / HQ for p in range(29)]
        expected = sorted(sorted(range(29), key=lambda p: -mean[p])[:9] + [29])
        for head in range(HKV):
            assert sel.keep[layer, head].tolist() == expected
    assert (sel.roles[..., -1] == WINDOW).all()


def rotation(pos: int, d: int) -> torch.Tensor:
    """RoPE at ``pos`` as a d × d matrix, built pair by pair: channels (i, i + d/2) turn by pos·θ_i."""
    r = torch.zeros(d, d)
    for i in range(d // 2):
        theta = pos / 10000 ** (2 * i / d)
        c, s = math.cos(theta), math.sin(theta)
        r[i, i], r[i, i + d // 2], r[i + d // 2, i], r[i + d // 2, i + d // 2] = c, -s, s, c
    return r


@pytest.mark.parametrize("cov", [True, False])
def test_expected_attention_by_hand(cov):
    n, n_kept, d, sinks, future = 24, 10, 8, 4, 16
    state = fake_state(n, n_kept, d=d)
    policy = make_policy("expected_attention", n_future_positions=future, n_sink=sinks, use_covariance=cov)
    sel = policy.select(state)
    rbar = sum(rotation(p, d) for p in range(n, n + future)) / future
    stats = state.query_stats
    g = HQ // HKV
    for layer in range(LYR):
        for head in range(HKV):
            per_query_head = []
            for h in range(head * g, (head + 1) * g):
                mu, sigma = rbar @ stats.mean[layer, h], rbar @ stats.cov[layer, h] @ rbar.T
                logits = [
                    float(k @ mu) / math.sqrt(d) + (float(k @ sigma @ k) / (2 * d) if cov else 0.0)
                    for k in state.keys[layer, head, sinks:]
                ]
                per_query_head.append(torch.softmax(torch.tensor(logits), 0))
            score = torch.stack(per_query_head).mean(0) * state.values[layer, head, sinks:].norm(dim=-1)
            expected = sorted(list(range(sinks)) + [sinks + int(i) for i in score.argsort(descending=True)[:6]])
            assert sel.keep[layer, head].tolist() == expected
            assert torch.allclose(sel.scores[layer, head, sinks:], score, atol=1e-6)
    assert (sel.roles[..., :sinks] == SINK).all()


def test_expected_attention_needs_statistics_that_leave_out_its_sinks():
    state = fake_state(24, 10)
    state.query_stats = QueryStats(skip=2, n=24, mean=state.query_stats.mean, cov=state.query_stats.cov, rotary=rotary)
    with pytest.raises(ValueError, match="n_sink"):
        make_policy("expected_attention").select(state)


def test_pyramid_budgets_shrink_with_depth_and_fall_back_like_kvpress():
    pyramid = layer_budgets(350, 0.5, 64, 2, 30)
    assert pyramid[0] > pyramid[-1] and pyramid == sorted(pyramid, reverse=True)
    assert abs(sum(pyramid) / 30 - 175) < 1  # the same total as a uniform budget
    assert pyramid[-1] >= 64
    capped = layer_budgets(1024, 0.5, 64, 20, 30)  # max_num capped at L − window lifts min_num to the window
    assert (capped[0], capped[-1]) == (960, 64)
    assert layer_budgets(350, 0.75, 64, 20, 30) == [88] * 30  # min_num 4.4 < the window: uniform round(87.5)


def test_pyramidkv_keeps_its_window_in_every_layer():
    state = fake_state(40, 20)
    sel = make_policy("pyramidkv", window_size=8, beta=2).select(state)
    counts = (sel.keep >= 0).sum(-1)
    assert counts[0, 0] > counts[-1, 0] and (counts == counts[:, :1]).all()  # per layer, not per head
    for layer in range(LYR):
        assert set(range(32, 40)) <= set(sel.keep[layer, 0].tolist())


def test_adakv_shares_the_layer_budget_between_heads_with_a_safeguard():
    scores = torch.tensor([[9.0, 8.0, 7.0, 6.0, 5.0, 4.0], [0.5, 0.4, 0.3, 0.2, 0.1, 0.05]])  # [Hkv, n]
    keep = adakv_keep_mask(scores, n_kept=3, alpha_safeguard=0.34)  # n_safe = 1
    assert int(keep.sum()) == 6  # the layer keeps Hkv × n_kept
    assert keep[0].tolist() == [True, True, True, True, True, False]
    assert keep[1].tolist() == [True, False, False, False, False, False]  # its safeguard: its own best
    no_guard = adakv_keep_mask(scores, n_kept=3, alpha_safeguard=0.0)
    assert not no_guard[1].any() and no_guard[0].all()  # without it, the weak head loses everything


def test_adakv_on_a_state_keeps_hkv_times_n_kept_per_layer_and_its_window():
    state = fake_state(40, 16)
    sel = make_policy("adakv", window_size=8).select(state)
    held = sel.keep >= 0
    assert (held.sum((-1, -2)) == HKV * 16).all()
    for layer in range(LYR):
        for head in range(HKV):
            assert set(range(32, 40)) <= set(sel.keep[layer, head][held[layer, head]].tolist())


def test_a_ragged_selection_pads_each_layer_to_its_fullest_head(tiny_cache):
    cache, keys, _ = tiny_cache
    keep = torch.tensor([[[0, 2, 5], [1, PAD, PAD]], [[3, 4, PAD], [0, 5, PAD]]])  # [Lyr, Hkv, 3]
    cache.keep(keep)
    assert cache.ragged
    assert cache.layers[0].keys.shape == (1, 2, 3, 8) and cache.layers[1].keys.shape == (1, 2, 2, 8)
    assert cache.positions()[0].tolist() == [[0, 2, 5], [1, PAD, PAD]]
    assert torch.equal(cache.layers[1].keys[0, 1], keys[1][1, [0, 5]])
    per_entry = 2 * 8 * 4
    assert cache.held_bytes() == 8 * per_entry and cache.nbytes() == (6 + 4) * per_entry
    mask = cache.attention_mask(0, torch.zeros(1, 4, 1, 8))  # [1, Hq, q, n]
    blocked = mask[0, :, 0] < 0
    assert blocked.tolist() == [[False] * 3] * 2 + [[False, True, True]] * 2  # query heads 2, 3 read KV head 1
    cache.layers[0].update(torch.zeros(1, 2, 1, 8), torch.zeros(1, 2, 1, 8))
    assert cache.layers[0].valid[1].tolist() == [True, False, False, True]  # a new token is held by every head
