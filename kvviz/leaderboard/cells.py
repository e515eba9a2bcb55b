"""One sample's prefill, shared by every cell of the sweep, and each cell's decision on it.

:func:`prefill` runs the sample's whole prompt once, recording what every policy may look at for
both modes: the last prompt queries' attention rows (for the query-aware state, and — the prefill
being causal — for the context alone), the prefill queries' statistics at both ends, and the keys
and values. :func:`decide` turns that into one cell's kept set per layer and KV head, a keep mask
over the prefill, the needle's retention and the bytes an evicting cache really holds for it; a policy
that makes its own pass over the prefill (KVzip's context reconstruction) runs it there, timed.
"""

from __future__ import annotations

import copy
from contextlib import ExitStack
from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from kvviz.capture.attention_fn import installed
from kvviz.capture.model_io import forward, model_info
from kvviz.capture.recorder import Recorder, RecorderConfig
from kvviz.eviction.cache import EvictingCache
from kvviz.eviction.policies import PAD, Policy, PolicyState, ScorerPolicy, n_kept_for
from kvviz.eviction.query_stats import QueryStats, collecting
from kvviz.eviction.reconstruction import reconstruction_scores
from kvviz.leaderboard.tasks import Sample
from kvviz.models import LoadedModel

MODES = ("query_aware", "query_agnostic")  # the question inside what is compressed, or fed after it


@dataclass
class Prefill:
    """The shared prefill of one sample (L tokens, n_context of them context)."""

    sample: Sample
    keys: list[torch.Tensor]  # per layer [Hkv, L, D]
    values: list[torch.Tensor]
    logits: torch.Tensor  # [V] after the last prompt token: the first answer token of query-aware runs
    window_rows: torch.Tensor  # [Lyr, Hq, W, L] the last W prompt queries' attention rows
    stats: dict[tuple[int, int], QueryStats]  # (skip, end) → query statistics
    kv_heads: int

    @property
    def n_tokens(self) -> int:
        return len(self.sample.ids)

    def compressed(self, mode: str) -> int:
        """Tokens a cell of this mode compresses: the whole prompt, or the context alone."""
        return self.n_tokens if mode == "query_aware" else self.sample.n_context


def prefill(lm: LoadedModel, sample: Sample, policies: list[Policy]) -> Prefill:
    """One forward over the sample's prompt with a recorder and the query statistics the policies need."""
    info = model_info(lm)
    ids, n_c = sample.ids, sample.n_context
    window = max([p.observation_window for p in policies] + [1]) + len(ids) - n_c
    rec = Recorder(
        info.layers, info.q_heads, len(ids), len(ids), RecorderConfig(obs_window=window, bin_factor=len(ids)), lm.device
    )
    rec.cache = cache = DynamicCache(config=lm.config)
    rec.begin_forward("prefill", len(ids))
    skips = sorted({p.query_stats_skip for p in policies if p.query_stats_skip is not None})
    with torch.inference_mode(), installed(lm.model), ExitStack() as stack:
        collectors = {s: stack.enter_context(collecting(lm.model, s, [n_c, len(ids)])) for s in skips}
        logits = forward(lm, ids, 0, cache, rec)[-1]
        stats = {(s, end): get(end) for s, get in collectors.items() for end in (n_c, len(ids))}
    keys, values = _held(cache)
    return Prefill(
        sample,
        keys,
        values,
        logits,
        rec.window_rows,
        stats,
        info.kv_heads,
    )


@dataclass
class Decision:
    """One cell's kept set on a prefill and what it costs."""

    keep: torch.Tensor  # [Lyr, Hkv, L] bool over the shared prefill (False beyond the compressed part)
    n_kept: int  # requested entries per layer and KV head
    stored_bytes: int  # the evicting cache's tensors after compression (ragged heads padded per layer)
    held_bytes: int  # the entries held (what a store of ragged heads keeps)
    full_bytes: int  # the compressed part uncompressed
    needle_retention: float  # share of the needle sentence's positions kept, over layers and KV heads
    counts: torch.Tensor  # [Lyr, Hkv] entries kept per layer and KV head
    extra_prefill_s: float = 0.0  # seconds of the policy's own pass over the prefill (KVzip's reconstruction)


def state_for(
    pre: Prefill, mode: str, policy: Policy, n_kept: int, ratio: float | None, with_kv: bool = True
) -> PolicyState:
    """The policy state right after a prefill of the compressed part (the context alone for query_agnostic)."""
    n = pre.compressed(mode)
    layers = len(pre.keys)
    w = pre.window_rows.shape[2] - (pre.n_tokens - n)  # rows of queries before position n (causal: same values)
    keys = values = None
    if policy.needs_kv and with_kv:
        keys = torch.stack([k[:, :n] for k in pre.keys])
        values = torch.stack([v[:, :n] for v in pre.values])
    skip = policy.query_stats_skip
    return PolicyState(
        positions=torch.arange(n).expand(layers, pre.kv_heads, n),
        n_kept=n_kept,
        n_prompt=n,
        step=0,
        kv_heads=pre.kv_heads,
        window_rows=pre.window_rows[:, :, :w, :n],
        keys=keys,
        values=values,
        query_stats=pre.stats.get((skip, n)) if skip is not None else None,
        ratio=ratio,
    )


def _held(cache: DynamicCache) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per layer keys and values [Hkv, L, D] of a prefilled cache."""
    keys, values = [], []
    for layer in cache.layers:
        if not isinstance(layer, DynamicLayer) or layer.keys is None or layer.values is None:
            raise RuntimeError("The prefill left a cache layer without keys and values.")
        keys.append(layer.keys[0])
        values.append(layer.values[0])
    return keys, values


def _scored_once(policy: Policy, memo: dict, key, state: PolicyState, build) -> Policy:
    """The policy, answering ``score`` from ``memo``: a policy's scores on one prefill do not depend on the
    budget, so every ratio of a (policy, mode) reuses the first one's."""
    if not isinstance(policy, ScorerPolicy):
        return policy
    if key not in memo:
        memo[key] = policy.score(build())
    twin = copy.copy(policy)
    twin.score = lambda _state: memo[key]  # type: ignore[method-assign,assignment]  # instance attribute: this copy only
    return twin


def decide(
    lm: LoadedModel, pre: Prefill, mode: str, policy: Policy, ratio: float, memo: dict | None = None
) -> Decision:
    """The cell's kept set (the policy's own ``select``), and the bytes an :class:`EvictingCache` holds for it.

    ``memo`` (one per prefill) keeps each (policy, mode)'s scores and the bytes measured for each shape of
    kept set, so the other ratios and cells do not recompute them.
    """
    memo = {} if memo is None else memo
    n = pre.compressed(mode)
    n_kept = n_kept_for(n, ratio=ratio)
    policy.validate(n_kept, n)
    layers, hkv, total = len(pre.keys), pre.kv_heads, pre.n_tokens
    extra_s = 0.0
    if policy.compresses(n, n_kept, 0):
        state = state_for(pre, mode, policy, n_kept, ratio, with_kv=False)
        repeat = policy.reconstruction_pass
        if repeat is not None:  # one repeat pass per (mode, pass settings) and prefill, timed
            key = ("reconstruction", mode, repeat)
            if key not in memo:
                keys, values = torch.stack([k[:, :n] for k in pre.keys]), torch.stack([v[:, :n] for v in pre.values])
                memo[key] = reconstruction_scores(lm, keys, values, pre.sample.ids[:n], *repeat)
            state.reconstruction, extra_s = memo[key].scores, memo[key].seconds
        chooser = _scored_once(
            policy, memo, ("scores", id(policy), mode), state, lambda: state_for(pre, mode, policy, n_kept, ratio)
        )
        keep_pos = chooser.select(state).keep  # [Lyr, Hkv, k], PAD after each head's list
    else:
        keep_pos = torch.arange(n).expand(layers, hkv, n)
    valid = keep_pos != PAD
    counts = valid.sum(-1)  # [Lyr, Hkv]
    shape = ("bytes", n, tuple(counts.max(-1).values.tolist()), int(counts.sum()))
    if shape not in memo:  # measured on an evicting cache that really keeps this selection
        cache = EvictingCache(lm.config).load([k[:, :n] for k in pre.keys], [v[:, :n] for v in pre.values])
        full = cache.nbytes()
        cache.keep(keep_pos)
        memo[shape] = (cache.nbytes(), cache.held_bytes(), full)
    stored, held, full = memo[shape]
    keep = torch.zeros(layers, hkv, total + 1, dtype=torch.bool)
    keep.scatter_(-1, torch.where(valid, keep_pos, total), True)
    keep = keep[..., :total]
    a, b = pre.sample.needle_span
    return Decision(
        keep=keep,
        n_kept=n_kept,
        stored_bytes=stored,
        held_bytes=held,
        full_bytes=full,
        needle_retention=float(keep[..., a:b].float().mean()),
        counts=counts,
        extra_prefill_s=extra_s,
    )
