"""KVzip (Kim et al. 2025): keep what the model needs to repeat the context, with one budget over the whole cache.

After the prefill the model is asked to repeat its context (:mod:`kvviz.eviction.reconstruction`:
"Repeat the previous context exactly." and the context, fed through the cache); a cached entry's
score is the largest attention any repeat query of its KV group pays it. The first ``n_sink``
positions are always kept. Then one bottom-k over every layer and KV head evicts the
``int(Lyr × Hkv × n × r)`` lowest scores (``layerwise``: the same count in every layer, shared
among its heads), so each layer and head ends with its own budget — the budget map shows them.
The decision does not depend on the question (it is query-agnostic) and costs a second pass over
the context (2–3× the prefill). These are kvpress's ``KVzipPress`` semantics (0.5.5): the header
of the chat template is never reconstructed (score 0, evicted first), and kvpress masks the
evicted entries (frees nothing) where kvviz's evicting cache drops them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kvviz.eviction.policies.base import KEPT, SINK, Policy, PolicyState, Selection, pad_ragged


def kvzip_keep_mask(
    scores: torch.Tensor, n_sink: int, ratio: float | None, n_kept: int, layerwise: bool
) -> torch.Tensor:
    """Scores [Lyr, Hkv, n] → kept mask [Lyr, Hkv, n], in kvpress's order of operations.

    The sinks get the largest score + 1; the number evicted is ``int(numel × ratio)`` over the whole
    cache (per layer ``int(Hkv × n × ratio)`` when ``layerwise``), or, for a budget in tokens,
    what leaves ``n_kept`` entries per layer and KV head on average. A global bottom-k fixes how many
    each layer loses; each layer then drops its own bottom-k across its heads.
    """
    scores = scores.clone()
    scores[..., :n_sink] = scores.amax() + 1.0
    layers, hkv, n = scores.shape
    if layerwise:
        per_layer = int(hkv * n * ratio) if ratio is not None else hkv * (n - n_kept)
        pruned_layers = torch.full((layers,), per_layer, dtype=torch.long)
    else:
        total = int(scores.numel() * ratio) if ratio is not None else layers * hkv * (n - n_kept)
        pruned = torch.topk(-scores.reshape(-1), total).indices
        pruned_layers = torch.bincount(pruned // (hkv * n), minlength=layers)
    keep = torch.ones(layers, hkv * n, dtype=torch.bool)
    for layer in range(layers):
        drop = torch.topk(-scores[layer].reshape(-1), int(pruned_layers[layer])).indices
        keep[layer, drop.cpu()] = False
    return keep.view(layers, hkv, n)


@dataclass
class KVzip(Policy):
    """Context-reconstruction scores, one bottom-k over all layers and KV heads; decided once after the prefill."""

    n_sink: int = field(default=4, metadata={"help": "first tokens always kept", "min": 0, "max": 64})
    layerwise: bool = field(
        default=False, metadata={"help": "the same budget in every layer (shared among its heads only)"}
    )
    chunk_size: int = field(
        default=2048, metadata={"help": "context tokens each repeat pass reconstructs", "min": 16, "max": 8192}
    )

    name = "kvzip"
    title = "KVzip (context reconstruction, one global budget)"
    paper = "Kim et al. 2025, KVzip: Query-Agnostic KV Cache Compression with Context Reconstruction"
    summary = (
        "After the prefill the model is asked to repeat its context; each entry scores the most attention a repeat "
        "query pays it, and one bottom-k over every layer and KV head evicts the lowest, so each layer and head keeps "
        "its own number of entries. The choice ignores the question and costs a second pass over the context."
    )
    score_label = "largest attention from the repeat queries (max over queries and the KV group)"
    needs_kv = True
    ragged = True

    def validate(self, n_kept: int, n_prompt: int) -> None:
        for name, low in (("n_sink", 0), ("chunk_size", 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ValueError(f"{name} must be a whole number ≥ {low}, got {v!r}.")
        if n_kept < n_prompt and n_kept < self.n_sink:
            raise ValueError(
                f"KVzip always keeps its {self.n_sink} sink tokens: the budget ({n_kept}) must be at least n_sink."
            )

    @property
    def reconstruction_pass(self) -> tuple[int, int]:
        return int(self.n_sink), int(self.chunk_size)

    def select(self, state: PolicyState) -> Selection:
        scores = state.reconstruction
        n = state.positions.shape[-1]
        if scores is None:
            raise ValueError("KVzip needs the context-reconstruction scores (kvviz.eviction.reconstruction).")
        if scores.shape != state.positions.shape:
            raise ValueError(f"Reconstruction scores {tuple(scores.shape)} do not match the cache {n} entries.")
        s = int(self.n_sink)
        shown = scores.clone()
        shown[..., :s] = float("nan")
        if n <= state.n_kept:
            every = torch.full(state.positions.shape, KEPT, dtype=torch.long)
            every[..., :s] = SINK
            return Selection(keep=state.positions, roles=every, scores=shown)
        mask = kvzip_keep_mask(scores, s, state.ratio, state.n_kept, bool(self.layerwise))
        keep: list[list[torch.Tensor]] = []
        roles: list[list[torch.Tensor]] = []
        for layer in range(mask.shape[0]):
            keep.append([state.positions[layer, h][mask[layer, h]] for h in range(mask.shape[1])])
            roles.append([torch.where(k < s, SINK, KEPT) for k in keep[-1]])
        device = state.positions.device
        return Selection(keep=pad_ragged(keep, device), roles=pad_ragged(roles, device).clamp(min=0), scores=shown)
