"""The prefilling segments of a packed forward (:mod:`kvviz.capture.packed`), attended together.

A room's first step prefills every question: two dozen segments of a dozen tokens each. Attended one by
one, each costs its recorder's chunk loop — some twenty small operations — per layer, 720 loops a step,
more than the step's arithmetic. Here the plain causal segments whose recorders would make their own
outputs (:meth:`~kvviz.capture.recorder.Recorder.takes_prefill`: fp32, keys in order, a causal mask) go
through one computation per layer: their queries and keys side by side (padded to the longest), each
query's scores masked to its own keys up to itself, the softmax, × values — what each recorder computes
alone (:meth:`~kvviz.capture.recorder.Recorder.own_output`), for all of them at once. Each recorder then
reduces its own rows (:meth:`~kvviz.capture.recorder.Recorder.take_prefill`), and the segments' last rows
are checked against the model's implementation with the step's other probes, in one call per layer.
"""

from __future__ import annotations

import torch

MAX_SCORES = (
    2**22
)  # at most this many fp32 scores at once (the default RecorderConfig.chunk_elements bounds a recorder's own chunks alike)


def fits(segments: int, heads: int, rows: int, keys: int) -> bool:
    """Whether ``segments`` segments of at most ``rows`` queries over at most ``keys`` keys fit one computation."""
    return segments * heads * rows * keys <= MAX_SCORES


def attend_prefilling(
    query: torch.Tensor,
    bounds: list[tuple[int, int]],
    kv: tuple[torch.Tensor, torch.Tensor, list[int]],
    scale: float,
    masks: dict,
) -> tuple[torch.Tensor, torch.Tensor]:
    """G segments' attention: their queries are rows ``bounds[j]`` of the packed ``query`` ([1, Hq, N, D]),
    their keys and values ``kv`` ([G, Hkv, K, D] each, segment j's first ``lens[j]``; its queries are its
    last ``n_j`` keys' positions). Returns the outputs [G, Hq, n, Dv] and probabilities [G, Hq, n, K] (n the
    longest segment; a segment's rows past its own, and keys past its own, are padding). ``masks``: the
    masks already made this forward, by the segments' rows and lengths (every layer has the same)."""
    key, value, lens = kv
    g = len(bounds)
    sizes = [b - a for a, b in bounds]
    n, width = max(sizes), key.shape[2]
    hq, d = query.shape[1], query.shape[-1]
    hkv = key.shape[1]
    at = (query.device, tuple(bounds), tuple(lens), width)
    made = masks.get(at)
    if made is None:
        # each segment's rows, padded with its last row (computed, never read); who sees what: query r of a
        # segment of n_j queries over k_j keys sees keys 0 … k_j − n_j + r (padded rows see no NaN)
        take = torch.tensor(
            [a + min(r, s - 1) for (a, _), s in zip(bounds, sizes) for r in range(n)], device=query.device
        )
        last = torch.tensor([k - s for k, s in zip(lens, sizes)], device=query.device)[:, None] + torch.arange(
            n, device=query.device
        )
        hidden = torch.arange(width, device=query.device) > last[:, :, None]  # [G, n, K]: masked out
        made = masks[at] = (take, hidden[:, None])
    take, hidden = made
    q = query[0].index_select(1, take).view(hq, g, n, d).transpose(0, 1)  # [G, Hq, n, D]
    scores = torch.matmul((q.float() * scale).reshape(g, hkv, (hq // hkv) * n, d), key.float().transpose(2, 3))
    scores = scores.view(g, hq, n, width).masked_fill_(hidden, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs.view(g, hkv, (hq // hkv) * n, width), value.float()).view(g, hq, n, -1)
    return out, probs
