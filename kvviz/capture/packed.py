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
        self._masks: dict = {}  # the decoding segments' padding mask, the same for every layer of the forward

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
        :meth:`~kvviz.capture.recorder.Recorder.own_output`), and the recorders get the probabilities.
        A recorder's first decode step checks its rows against the layer's output; for plain SDPA calls
        that check runs here for every decoding segment at once — in fp32 SDPA runs too and must give
        the output computed from the probabilities, in other dtypes :func:`check_decoding` checks SDPA's
        output against the rows — and their recorders get no values (nothing left for them to check)."""
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
            out, rows, probabilities = _attend_decoding(
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
            for j, i in enumerate(together):
                outs[i] = out[j : j + 1]
                if recorders[j] is not None:
                    row = rows[j, :, : lens[j]]
                    fast = getattr(recorders[j], "record_packed_decode", None) if probabilities and not check else None
                    if fast is not None and fast(layer, outs[i], row):
                        continue
                    (a, b), (key, value) = self.cache.bounds[i], parts[i] or (slotted[i].keys, slotted[i].values)
                    given = None if check else value
                    kind = "probs" if probabilities else "scores"
                    record_call(
                        recorders[j], module, query[:, :, a:b], key, given, None, outs[i], None, kwargs, **{kind: row}
                    )
            if len(together) == len(parts):  # a decode step of every sequence: the batch's output, in order
                return out.transpose(0, 1), None
        probes: list[tuple[int, int, torch.Tensor]] = []  # (segment, rows, its recorder's output there): checked below
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
                key, value, lens = _padded([parts[i] for i, _ in group])
            ends = [self.cache.bounds[i][1] for i, _ in group]
            take = torch.tensor([e - r + t for e in ends for t in range(r)], device=query.device)
            hq, d = query.shape[1], query.shape[-1]
            q = query[0].index_select(1, take).view(hq, len(group), r, d).transpose(0, 1)  # [G, Hq, r, D]
            last = torch.tensor(lens, device=query.device)[:, None] - r + torch.arange(r, device=query.device)
            mask = (torch.arange(key.shape[2], device=query.device) <= last[:, :, None])[:, None]  # [G, 1, r, k]
            ref = implementation(module, q, key, value, mask, *args, **kwargs)[0]  # [G, r, Hq, Dv]
            mine = torch.cat([m for _, m in group])
            agree(module.layer_idx, mine, ref, query.dtype, "its probabilities × values do not reproduce")


def _attend_decoding(
    module,
    implementation,
    query,
    starts: list[int],
    parts: list | None,
    *args,
    check: bool = False,
    batched: tuple | None = None,
    own: bool = False,
    masks: dict | None = None,
    **kwargs,
):
    """Attention for B one-query segments at once (their query rows ``starts``, their caches' ``parts``):
    their outputs [B, 1, Hq, Dv]; every segment's row [B, Hq, longest k] (fp32; only the first k of a
    segment's row are its keys); and whether those rows are probabilities (``own``: the output is computed
    from them) or plain scores q·kᵀ (the output is SDPA's). ``check``: also :func:`check_decoding` them
    against SDPA. ``batched``: their keys and values already side by side ([B, Hkv, longest, D] each) with
    their lengths (:meth:`~kvviz.engine.slots.SlotKV.batch`), so nothing is padded here and ``parts`` is
    not read. ``masks``: padding masks already made, by lengths (every layer of a forward has the same)."""
    b = len(starts)
    if starts == list(range(starts[0], starts[0] + b)):  # side by side in the packed row: a view
        q = query[0, :, starts[0] : starts[0] + b].transpose(0, 1).unsqueeze(2)  # [B, Hq, 1, D]
    else:
        q = query[0, :, starts].transpose(0, 1).unsqueeze(2)
    if batched is None:
        assert parts is not None
        batched = _padded(parts)
    key, value, lens = batched
    width = max(lens)
    mask = None
    if min(lens) != width:
        made = masks if masks is not None else {}
        mask = made.get((tuple(lens), key.device))
        if mask is None:
            mask = (torch.arange(width, device=key.device) < torch.tensor(lens, device=key.device)[:, None])[
                :, None, None
            ]
            made[(tuple(lens), key.device)] = mask
    hq, hkv, d = q.shape[1], key.shape[1], q.shape[-1]
    scores = torch.matmul(q.float().reshape(b, hkv, hq // hkv, d), key.float().transpose(2, 3))
    scores = scores.view(b, hq, width)
    scale = kwargs.get("scaling")
    scale = scale if scale is not None else d**-0.5
    if own:
        probs, out = _softmax_values(scores, value, mask, scale)
        if check:
            ref, _ = implementation(module, q, key, value, mask, *args, **kwargs)
            agree(module.layer_idx, out[:, 0], ref[:, 0], query.dtype, "its probabilities × values do not reproduce")
        return out, probs, True
    out, _ = implementation(module, q, key, value, mask, *args, **kwargs)  # [B, 1, Hq, Dv]
    if check:
        check_decoding(module.layer_idx, scores, value, mask, out, scale, query.dtype)
    return out, scores, False


def _softmax_values(scores, value, mask, scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """B decoding segments' probabilities [B, Hq, k] (softmax of their scaled scores over their own keys)
    and their attention output [B, 1, Hq, Dv] (probabilities × values). scores: [B, Hq, k] (unscaled
    q·kᵀ); value: [B, Hkv, k, Dv]; mask: [B, 1, 1, k] (True: a key of the segment's own), or None."""
    b, hq, width = scores.shape
    hkv, dv = value.shape[1], value.shape[-1]
    logits = scores * scaling
    if mask is not None:
        logits = logits.masked_fill(~mask[:, 0], float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    out = torch.matmul(probs.view(b, hkv, hq // hkv, width), value.float()).view(b, 1, hq, dv)
    return probs, out


def _probe_later(probes: list, segment: int):
    """A recorder's probe that keeps what it would check, for :meth:`PackedAttention._probe`."""
    return lambda rows, _mask, mine: probes.append((segment, rows, mine))


def _padded(parts: list) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Caches' keys and values ([1, Hkv, k, D] each) side by side, zero-padded to the longest, and their lengths."""
    lens = [k.shape[2] for k, _ in parts]
    if len(set(lens)) == 1:
        return torch.cat([k for k, _ in parts]), torch.cat([v for _, v in parts]), lens
    key = parts[0][0].new_zeros(len(parts), parts[0][0].shape[1], max(lens), parts[0][0].shape[3])
    value = parts[0][1].new_zeros(len(parts), parts[0][1].shape[1], max(lens), parts[0][1].shape[3])
    for j, (k, v) in enumerate(parts):
        key[j, :, : lens[j]] = k[0]
        value[j, :, : lens[j]] = v[0]
    return key, value, lens


def check_decoding(layer: int, scores, value, mask, out, scaling: float, dtype: torch.dtype) -> None:
    """Raise :class:`~kvviz.capture.attention_fn.CaptureError` unless, for every one of B decoding
    segments, the softmax of its scaled scores over its own keys × its values reproduces SDPA's output:
    the check a recorder's first decode step makes (:func:`~kvviz.capture.attention_math.check_output`),
    for the whole batch in three ops. scores: [B, Hq, k] (unscaled q·kᵀ); value: [B, Hkv, k, Dv];
    mask: [B, 1, 1, k] (True: a key of the segment's own), or None; out: [B, 1, Hq, Dv]."""
    _, mine = _softmax_values(scores, value, mask, scaling)
    agree(layer, mine[:, 0], out[:, 0], dtype, "its probabilities × values do not reproduce")


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
    for seg in segments:
        if seg.recorder is not None:
            seg.recorder.end_forward()
    return list(out.logits[0].float().split(keep))
