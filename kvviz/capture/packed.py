"""Several sequences through one forward: their new tokens side by side, each attending to its own cache.

A serving engine decodes many requests at once because one forward over ``B`` tokens reads the
weights once instead of ``B`` times (the weights, not the arithmetic, bound a small model's decode
step). kvviz packs the tokens the sequences feed this step — one each while decoding, a chunk of a
prompt while prefilling — into one row of ``N`` tokens at their own absolute positions, so every
weight matrix multiplies them together. Attention is the one operation that must not mix them:
:class:`PackedCache` hands each sequence's new keys and values to that sequence's own transformers
cache, and the capture attention function (:mod:`kvviz.capture.attention_fn`) gives the query rows
of each sequence to the model's own attention implementation with that sequence's cache and the mask
its solo forward would have had, and to that sequence's recorder. Each sequence therefore sees
exactly what a run of its own sees; only the matrix products' summation order may differ (fp32: far
below 1e-4 in the logits).

Packing needs a model whose layers are all full (global) attention and that take their positions
from ``position_ids``; :func:`packable` says which.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer
from transformers.masking_utils import create_causal_mask

from kvviz.capture.recorder import RecordsAttention
from kvviz.models import LoadedModel


@dataclass
class Segment:
    """One sequence's share of a packed forward: ``ids`` at absolute positions ``start…``, appended to
    ``cache``; ``recorder`` (or None) hears this sequence's attention only."""

    ids: Sequence[int]
    start: int
    cache: Cache
    recorder: RecordsAttention | None = None


class PackedCache(Cache):
    """Stands in for the model's cache during a packed forward.

    ``update`` splits a layer's new keys and values by segment and appends each part to its sequence's
    own cache; what each cache returns (that sequence's whole keys and values for the layer) waits in
    :attr:`current` for the attention function. To the model's mask code the cache looks empty (the
    packed mask it builds is not used: each segment gets its own).
    """

    def __init__(self, segments: Sequence[Segment]):
        super().__init__(layer_class_to_replicate=DynamicLayer)
        self.segments = list(segments)
        ends = torch.tensor([len(s.ids) for s in self.segments]).cumsum(0).tolist()
        self.bounds = list(zip([0, *ends[:-1]], ends))
        self.current: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}

    def update(self, key_states, value_states, layer_idx: int, *args: Any, **kwargs: Any):
        self.current[layer_idx] = [
            seg.cache.update(key_states[:, :, a:b], value_states[:, :, a:b], layer_idx, *args, **kwargs)
            for seg, (a, b) in zip(self.segments, self.bounds)
        ]
        return key_states, value_states

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return query_length, 0

    def get_query_offset(self, layer_idx: int = 0) -> int:
        return 0


class PackedAttention:
    """Handed to the capture attention function in place of a recorder: runs the model's attention
    segment by segment (see the module docstring)."""

    def __init__(self, cache: PackedCache, masks: list[Any]):
        self.cache, self.masks = cache, masks

    def attend(self, module, implementation, query, record, *args, **kwargs):
        """The layer's output [1, N, Hq, Dv]: each segment's query rows against its own keys and values,
        through ``implementation`` with the segment's own mask; ``record(recorder, ...)`` hands each
        segment's tensors to its recorder."""
        layer = module.layer_idx
        outs = []
        parts = self.cache.current.pop(layer)
        for seg, (a, b), (key, value), mask in zip(self.cache.segments, self.cache.bounds, parts, self.masks):
            q = query[:, :, a:b]
            out, weights = implementation(module, q, key, value, mask, *args, **kwargs)
            if seg.recorder is not None:
                record(seg.recorder, module, q, key, value, mask, out, weights, kwargs)
            outs.append(out)
        return torch.cat(outs, dim=1), None


def packable(lm: LoadedModel) -> bool:
    """Whether ``lm`` can run packed: every layer full attention through transformers' attention
    interface, one cache entry per head (no MLA latent), positions taken from ``position_ids``."""
    from kvviz.capture.attention_fn import uses_interface
    from kvviz.memory.layout import cache_layout

    try:
        layout = cache_layout(lm.config)
    except ValueError:
        return False
    if layout.mla or not uses_interface(lm.model):
        return False
    if any(spec.layer_type != "full_attention" for spec in layout.layers):
        return False
    import inspect

    return "position_ids" in inspect.signature(lm.model.forward).parameters


def segment_masks(lm: LoadedModel, segments: Sequence[Segment]) -> list[Any]:
    """The mask each segment's solo forward would get from the model's mask code (None where the
    implementation needs none), built from the segment's own cache before the forward appends to it."""
    masks = []
    for seg in segments:
        n = len(seg.ids)
        embeds = torch.empty(1, n, 1, dtype=lm.dtype, device=lm.device)
        pos = torch.arange(seg.start, seg.start + n, device=lm.device)[None]
        masks.append(
            create_causal_mask(
                config=lm.config, inputs_embeds=embeds, attention_mask=None, cache=seg.cache, position_ids=pos
            )
        )
    return masks


def packed_forward(
    lm: LoadedModel, segments: Sequence[Segment], keep: Sequence[int] | None = None
) -> list[torch.Tensor]:
    """One forward of every segment's tokens; returns each segment's logits (fp32) at its last ``keep[i]``
    positions ([keep_i, vocab]; default 1). Each segment's cache grows by its tokens; each recorder hears
    its own rows and is closed (``end_forward``) after the forward."""
    from kvviz.capture.attention_fn import RECORDER_KWARG
    from kvviz.capture.model_io import cache_kwarg

    keep = list(keep) if keep is not None else [1] * len(segments)
    ids = [int(t) for seg in segments for t in seg.ids]
    pos = [p for seg in segments for p in range(seg.start, seg.start + len(seg.ids))]
    cache = PackedCache(segments)
    packed = PackedAttention(cache, segment_masks(lm, segments))
    rows = [i for (_, b), k in zip(cache.bounds, keep) for i in range(b - k, b)]
    out = lm.model(
        input_ids=torch.tensor([ids], device=lm.device),
        position_ids=torch.tensor([pos], device=lm.device),
        use_cache=True,
        logits_to_keep=torch.tensor(rows, device=lm.device),
        **{cache_kwarg(lm.model): cache, RECORDER_KWARG: packed},
    )
    for seg in segments:
        if seg.recorder is not None:
            seg.recorder.end_forward()
    return list(out.logits[0].float().split(keep))
