"""Several sequences through one forward: their new tokens side by side, each attending to its own cache.

A serving engine decodes many requests at once because one forward over ``B`` tokens reads the
weights once instead of ``B`` times (the weights, not the arithmetic, bound a small model's decode
step). kvviz packs the tokens the sequences feed this step — one each while decoding, a chunk of a
prompt while prefilling — into one row of ``N`` tokens at their own absolute positions, so every
weight matrix multiplies them together. Attention is the one operation that must not mix them:
:class:`PackedCache` hands each sequence's new keys and values to that sequence's own transformers
cache (the engine's short runs keep theirs side by side, :mod:`kvviz.engine.slots`, and are appended to
together), and the capture attention function (:mod:`kvviz.capture.attention_fn`) gives the query rows
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
from typing import Any, Protocol, TypeGuard

import torch
from transformers.cache_utils import Cache, DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import create_causal_mask

from kvviz.capture.attention_fn import attend_checked, plain_sdpa, record_call
from kvviz.capture.attention_math import agree
from kvviz.capture.packed_decode import StepRows, attend_decoding, padded
from kvviz.capture.packed_prefill import attend_prefilling, fits
from kvviz.capture.prefill_rows import PROBE_ROWS
from kvviz.capture.recorder import RecordsAttention
from kvviz.models import LoadedModel


class SlotKV(Protocol):
    """A store of one-token runs' keys and values side by side (:class:`kvviz.engine.slots.SlotKV`, the
    engine's; capture's equivalence check packs runs too, so this module states what it needs of one)."""

    def owns(self, layers: Sequence) -> TypeGuard[Sequence[DynamicLayer]]: ...  # slots of this store

    def append(self, layer: int, owners: Sequence, key_states: torch.Tensor, value_states, rows) -> None: ...

    def batch(self, layer: int, owners: Sequence) -> tuple[torch.Tensor, torch.Tensor, list[int]]: ...


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
    :attr:`current` for the attention function (None for a sequence in :attr:`slotted`: its slot's
    views are made only where they are read). To the model's mask code the cache looks empty (the
    packed mask it builds is not used: each segment gets its own).
    """

    def __init__(self, segments: Sequence[Segment], slots: SlotKV | None = None):
        super().__init__(layer_class_to_replicate=DynamicLayer)
        self.segments = list(segments)
        ends = torch.tensor([len(s.ids) for s in self.segments]).cumsum(0).tolist()
        self.bounds = list(zip([0, *ends[:-1]], ends))
        self.current: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self.slots = slots
        self.single = [i for i, (a, b) in enumerate(self.bounds) if b - a == 1]  # one new token each
        self.slotted: dict[int, dict[int, Any]] = {}  # layer -> segment -> its slot layer, written together

    def update(self, key_states, value_states, layer_idx: int, *args: Any, **kwargs: Any):
        """Each segment's new entries into its own cache; one-token segments whose caches all hold a slot
        of :attr:`slots` (:mod:`kvviz.engine.slots`) in one indexed write."""
        parts: list[Any] = [None] * len(self.segments)
        if self.slots is not None and len(self.single) > 1:
            owners = [self.segments[i].cache.layers[layer_idx] for i in self.single]
            if self.slots.owns(owners):
                rows = [self.bounds[i][0] for i in self.single]
                self.slots.append(layer_idx, owners, key_states, value_states, rows)
                self.slotted[layer_idx] = dict(zip(self.single, owners))  # their keys and values: read when needed
        for i, (seg, (a, b)) in enumerate(zip(self.segments, self.bounds)):
            if parts[i] is None and i not in self.slotted.get(layer_idx, ()):
                parts[i] = seg.cache.update(key_states[:, :, a:b], value_states[:, :, a:b], layer_idx, *args, **kwargs)
        self.current[layer_idx] = parts
        return key_states, value_states

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return query_length, 0

    def get_query_offset(self, layer_idx: int = 0) -> int:
        return 0


class PackedAttention:
    """Handed to the capture attention function in place of a recorder: runs the model's attention
    segment by segment, and the decoding segments together (see :meth:`attend`)."""

    def __init__(self, cache: PackedCache, masks: list[Any]):
        self.cache, self.masks = cache, masks
        # segments that feed one token with no mask of their own (a decode step under SDPA): attended together
        self.decoding = [i for i, ((a, b), m) in enumerate(zip(cache.bounds, masks)) if b - a == 1 and m is None]
        # whether a decoding segment's recorder takes its first decode step (it does not change within a forward)
        self.first_decode = any(getattr(cache.segments[i].recorder, "checks_decode", False) for i in self.decoding)
        self._masks: dict = {}  # the padding masks of the segments attended together: the same for every layer
        self.rows = StepRows()  # the decoding segments' rows, handed to their recorders after the forward

    def attend(self, module, implementation, query, *args, **kwargs):
        """The layer's output [1, N, Hq, Dv]: each segment's query rows against its own keys and values,
        through ``implementation`` with the segment's own mask, and each segment's recorder hears its own rows
        (:func:`~kvviz.capture.attention_fn.attend_one`).

        Under SDPA, the decoding segments (one query each, no mask) go through one call: their keys and
        values padded to the longest cache, the padding masked out, so each query still attends over
        exactly its own keys. Their recorders get their rows of one batched q·kᵀ. Per sequence, a decode
        step would otherwise cost two small kernel calls per layer — more than the step's arithmetic.
        For plain SDPA calls in fp32 the output is their probabilities × values, from the scores the
        recorders need anyway (as a lone run's recorder computes its decode output,
        :meth:`~kvviz.capture.recorder.Recorder.own_output`), and the recorders get the probabilities — after
        the forward, every layer's at once (:class:`~kvviz.capture.packed_decode.StepRows`).
        A recorder's first decode step checks its rows against the layer's output; for plain SDPA calls
        that check runs here for every decoding segment at once — in fp32 SDPA runs too and must give
        the output computed from the probabilities, in other dtypes :func:`check_decoding` checks SDPA's
        output against the rows — and their recorders get no values (nothing left for them to check).

        The prefilling segments whose recorders would make their own outputs attend together too
        (:meth:`_prefill_together`); the others, one by one as above."""
        layer = module.layer_idx
        parts = self.cache.current.pop(layer)
        outs: list[torch.Tensor | None] = [None] * len(parts)
        together = self.decoding if len(self.decoding) > 1 and implementation is sdpa_attention_forward else []
        slotted = self.cache.slotted.pop(layer, {})
        for i, owner in slotted.items():
            if i not in together:  # attended on its own below: its keys and values now
                parts[i] = (owner.keys, owner.values)
        if together:
            starts = [self.cache.bounds[i][0] for i in together]
            recorders = [self.cache.segments[i].recorder for i in together]
            plain = plain_sdpa(module, implementation, query, kwargs)
            check = self.first_decode and plain
            batched = None
            if self.cache.slots is not None and all(i in slotted for i in together):
                batched = self.cache.slots.batch(layer, [slotted[i] for i in together])
            else:
                for i in together:
                    if parts[i] is None:
                        parts[i] = (slotted[i].keys, slotted[i].values)
            out, rows, probabilities = attend_decoding(
                module,
                implementation,
                query,
                starts,
                None if batched is not None else [parts[i] for i in together],
                *args,
                check=check,
                batched=batched,
                own=plain and query.dtype == torch.float32,
                masks=self._masks,
                **kwargs,
            )
            lens = batched[2] if batched is not None else [parts[i][0].shape[2] for i in together]
            steps = probabilities and not check and all(hasattr(r, "record_packed_step") for r in recorders if r)
            if steps:  # their recorders hear this layer with every other, after the forward (record_steps)
                self.rows.add(layer, out, rows, lens)
            if len(together) == len(parts) and steps:  # a decode step of every sequence: the batch's output
                return out.transpose(0, 1), None
            for j, i in enumerate(together):
                outs[i] = out[j : j + 1]
                if recorders[j] is not None and not steps:
                    row = rows[j, :, : lens[j]]
                    (a, b), (key, value) = self.cache.bounds[i], parts[i] or (slotted[i].keys, slotted[i].values)
                    given = None if check else value
                    kind = "probs" if probabilities else "scores"
                    record_call(
                        recorders[j], module, query[:, :, a:b], key, given, None, outs[i], None, kwargs, **{kind: row}
                    )
            if len(together) == len(parts):  # a decode step of every sequence: the batch's output, in order
                return out.transpose(0, 1), None
        probes: list[tuple[int, int, torch.Tensor]] = []  # (segment, rows, its recorder's output there): checked below
        if plain_sdpa(module, implementation, query, kwargs):
            self._prefill_together(module, query, parts, outs, probes, kwargs.get("scaling"))
        for i, (seg, (a, b), mask) in enumerate(zip(self.cache.segments, self.cache.bounds, self.masks)):
            if outs[i] is not None:
                continue
            key, value = parts[i]
            q = query[:, :, a:b]
            outs[i] = attend_checked(
                seg.recorder, module, implementation, q, key, value, mask, args, kwargs, _probe_later(probes, i)
            )[0]
        if probes:
            self._probe(module, implementation, query, parts, probes, args, kwargs)
        return torch.cat(outs, dim=1), None

    def _prefill_together(self, module, query, parts, outs: list, probes: list, scaling) -> None:
        """The prefilling segments whose recorders take a packed forward's rows (``takes_prefill``), attended
        together (:mod:`kvviz.capture.packed_prefill`): each recorder handed its probabilities and output, each
        segment's last rows kept for :meth:`_probe`."""
        layer, segments, bounds = module.layer_idx, self.cache.segments, self.cache.bounds
        recs: list[Any] = [seg.recorder for seg in segments]  # a Recorder, or a stand-in without these methods
        group = [
            i
            for i, o in enumerate(outs)
            if o is None
            and hasattr(recs[i], "takes_prefill")
            and recs[i].takes_prefill(layer, bounds[i][1] - bounds[i][0], parts[i][0], self.masks[i])
        ]
        sizes = [bounds[i][1] - bounds[i][0] for i in group]
        keys = [parts[i][0].shape[2] for i in group]
        if len(group) < 2 or not fits(len(group), query.shape[1], max(sizes), max(keys)):
            return
        owners = [segments[i].cache.layers[layer] for i in group] if self.cache.slots is not None else []
        if self.cache.slots is not None and self.cache.slots.owns(owners):
            kv = self.cache.slots.batch(layer, owners)
        else:
            kv = padded([parts[i] for i in group])
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        out, probs = attend_prefilling(query, [bounds[i] for i in group], kv, scale, self._masks)
        for j, (i, n, k) in enumerate(zip(group, sizes, keys)):
            outs[i] = out[j, :, :n].transpose(0, 1).unsqueeze(0)  # [1, n, Hq, Dv]
            recs[i].take_prefill(layer, probs[j, :, :n, :k], outs[i])
            r = min(PROBE_ROWS, n)
            probes.append((i, r, outs[i][:, -r:]))

    def record_steps(self) -> None:
        """After the forward: each decoding segment's recorder gets its rows of every layer attended
        together (:class:`~kvviz.capture.packed_decode.StepRows`)."""
        self.rows.hand_over([self.cache.segments[i].recorder for i in self.decoding])

    def _probe(self, module, implementation, query, parts, probes, args, kwargs) -> None:
        """Check the segments' recorders' own outputs (:meth:`~kvviz.capture.recorder.Recorder.own_output`)
        against the implementation, one call per number of rows checked: each segment's last ``rows`` queries
        over its own keys (side by side in the engine's slots, else padded), a causal mask of their rows with
        the padding masked out (a recorder makes its own output for causal calls only) — what each recorder's
        own probe would check alone, in one call and one comparison instead of one per sequence."""
        slots = self.cache.slots
        for r in sorted({rows for _, rows, _ in probes}):
            group = [(i, mine) for i, rows, mine in probes if rows == r]
            owners = (
                [self.cache.segments[i].cache.layers[module.layer_idx] for i, _ in group] if slots is not None else []
            )
            if slots is not None and owners and slots.owns(owners):
                key, value, lens = slots.batch(module.layer_idx, owners)
            else:
                key, value, lens = padded([parts[i] for i, _ in group])
            ends = [self.cache.bounds[i][1] for i, _ in group]
            take = torch.tensor([e - r + t for e in ends for t in range(r)], device=query.device)
            hq, d = query.shape[1], query.shape[-1]
            q = query[0].index_select(1, take).view(hq, len(group), r, d).transpose(0, 1)  # [G, Hq, r, D]
            last = torch.tensor(lens, device=query.device)[:, None] - r + torch.arange(r, device=query.device)
            mask = (torch.arange(key.shape[2], device=query.device) <= last[:, :, None])[:, None]  # [G, 1, r, k]
            ref = implementation(module, q, key, value, mask, *args, **kwargs)[0]  # [G, r, Hq, Dv]
            mine = torch.cat([m for _, m in group])
            agree(module.layer_idx, mine, ref, query.dtype, "its probabilities × values do not reproduce")


def _probe_later(probes: list, segment: int):
    """A recorder's probe that keeps what it would check, for :meth:`PackedAttention._probe`."""
    return lambda rows, _mask, mine: probes.append((segment, rows, mine))


def packable(lm: LoadedModel) -> bool:
    """Whether ``lm`` can run packed: every layer full attention through transformers' attention
    interface, one cache entry per head (no MLA latent), positions taken from ``position_ids``."""
    from kvviz.memory.layout import cache_layout
    from kvviz.models import uses_interface

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
    lm: LoadedModel, segments: Sequence[Segment], keep: Sequence[int] | None = None, slots: SlotKV | None = None
) -> list[torch.Tensor]:
    """One forward of every segment's tokens; returns each segment's logits (fp32) at its last ``keep[i]``
    positions ([keep_i, vocab]; default 1). Each segment's cache grows by its tokens; each recorder hears
    its own rows and is closed (``end_forward``) after the forward. ``slots``: the store some segments'
    caches keep their entries in (see :class:`PackedCache`)."""
    from kvviz.capture.attention_fn import RECORDER_KWARG
    from kvviz.capture.model_io import cache_kwarg

    keep = list(keep) if keep is not None else [1] * len(segments)
    ids = [int(t) for seg in segments for t in seg.ids]
    pos = [p for seg in segments for p in range(seg.start, seg.start + len(seg.ids))]
    cache = PackedCache(segments, slots)
    packed = PackedAttention(cache, segment_masks(lm, segments))
    rows = [i for (_, b), k in zip(cache.bounds, keep) for i in range(b - k, b)]
    out = lm.model(
        input_ids=torch.tensor([ids], device=lm.device),
        position_ids=torch.tensor([pos], device=lm.device),
        use_cache=True,
        logits_to_keep=torch.tensor(rows, device=lm.device),
        **{cache_kwarg(lm.model): cache, RECORDER_KWARG: packed},
    )
    packed.record_steps()
    for seg in segments:
        if seg.recorder is not None:
            seg.recorder.end_forward()
    return list(out.logits[0].float().split(keep))
