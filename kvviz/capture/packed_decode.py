"""The decoding segments of a packed forward (:mod:`kvviz.capture.packed`): one query each, attended together.

A room's decode step feeds every sequence one token. Attended one by one, each would cost a few small
kernel calls per layer — more than the step's arithmetic — and handing each sequence's recorder its
row would cost a Python call per sequence per layer. Here their keys and values go side by side (padded
to the longest, the padding masked out) into one call per layer (:func:`attend_decoding`), and
:class:`StepRows` keeps every layer's rows to hand each recorder its whole step at once after the
forward (:meth:`~kvviz.capture.recorder.Recorder.record_packed_step`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvviz.capture.attention_math import agree


class StepRows:
    """A packed decode step's rows, layer by layer, for the decoding segments' recorders: each gets its
    probabilities and outputs of every layer in one call once the forward is over (not one per layer
    while it runs: 24 sequences × 30 layers were 720 calls a step)."""

    def __init__(self) -> None:
        self._layers: list[tuple[int, torch.Tensor, torch.Tensor, list[int]]] = []

    def add(self, layer: int, out: torch.Tensor, probs: torch.Tensor, lens: list[int]) -> None:
        """One layer's rows: ``out`` [B, 1, Hq, Dv] the segments' outputs, ``probs`` [B, Hq, W] the
        probabilities they came from (the first ``lens[j]`` of row j are segment j's keys)."""
        self._layers.append((layer, out, probs, lens))

    def hand_over(self, recorders: Sequence) -> None:
        """Each of the B segments' recorders (None: not recorded) gets its rows of every layer added,
        one call per group of layers whose rows have one width and device (one group unless caches differ by
        layer or a dispatched model's layers sit on several devices)."""
        groups: dict[tuple, list] = {}
        for item in self._layers:
            groups.setdefault((item[2].shape[-1], item[2].device), []).append(item)
        self._layers = []
        for items in groups.values():
            layers = [layer for layer, *_ in items]
            probs = torch.stack([p for _, _, p, _ in items], dim=1)  # [B, L, Hq, W]
            outs = torch.stack([o.reshape(o.shape[0], -1) for _, o, _, _ in items], dim=1)  # [B, L, Hq·Dv]
            for j, rec in enumerate(recorders):
                if rec is not None:
                    rec.record_packed_step(layers, outs[j], probs[j], [lens[j] for *_, lens in items])


def attend_decoding(
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
        batched = padded(parts)
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
        probs, out = softmax_values(scores, value, mask, scale)
        if check:
            ref, _ = implementation(module, q, key, value, mask, *args, **kwargs)
            agree(module.layer_idx, out[:, 0], ref[:, 0], query.dtype, "its probabilities × values do not reproduce")
        return out, probs, True
    out, _ = implementation(module, q, key, value, mask, *args, **kwargs)  # [B, 1, Hq, Dv]
    if check:
        check_decoding(module.layer_idx, scores, value, mask, out, scale, query.dtype)
    return out, scores, False


def softmax_values(scores, value, mask, scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
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


def padded(parts: list) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
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
    _, mine = softmax_values(scores, value, mask, scaling)
    agree(layer, mine[:, 0], out[:, 0], dtype, "its probabilities × values do not reproduce")
