"""A decode step's attention rows, reduced: one query per head per layer, many layers per step.

A decode row is tiny ([Hq, k] per layer) and every step has one per layer; reduced one by one they
would cost ~10 small kernel calls per layer. :class:`DecodeRows`, a part of
:class:`~kvviz.capture.recorder.Recorder`, keeps the plain layers' scores (or, where the recorder
computed the layer's output itself, their probabilities) back to back in one buffer and reduces them
once per step in :meth:`DecodeRows._flush_decode`; masked, soft-capped, sink or evicted layers take
the exact row path at once.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Protocol

import torch

from kvviz.capture.attention_math import Extras, check_output, decode_probs
from kvviz.capture.binning import bin_positions


class RowsConfig(Protocol):
    """The part of :class:`~kvviz.capture.recorder.RecorderConfig` that the row reductions read (here and in
    :mod:`kvviz.capture.prefill_rows`; the recorder module builds on both, so they name this instead)."""

    sink_k: int
    bin_factor: int
    chunk: int
    chunk_elements: int


class DecodeRows:
    """The Recorder's decode-step reductions (its state is the Recorder's; see there)."""

    if TYPE_CHECKING:  # what the Recorder provides
        cfg: RowsConfig
        colsum: torch.Tensor
        sink_mass: torch.Tensor
        decode_rows: torch.Tensor
        t_total: int
        n_prompt: int
        q_heads: int
        nb: int
        _pending: list[tuple[int, torch.Tensor, float | None]]
        _pending_blocks: list[tuple[slice, torch.Tensor]]
        _step_scores: torch.Tensor
        _step_used: int
        _decode_checked: bool

        def _key_positions(self, layer: int, k_len: int) -> torch.Tensor | None: ...

        def _learned(self, layer: int, device) -> torch.Tensor: ...

        def _keep_turn(self, layer, p: torch.Tensor, q0: int) -> None: ...

    def _record_decode(
        self, layer, query, key, mask, scaling, softcap, extras: Extras | None, value, out, scores=None, probs=None
    ) -> None:
        """Plain layers (no mask, soft-cap, sinks or bias, keys in order) only compute their scores here;
        the softmax and every reduction run once per step for all of them in :meth:`_flush_decode`
        (a few large ops instead of ~10 tiny ones per layer). The first decode step takes the exact
        path for every layer and checks it against the layer's output. ``scores`` / ``probs``: the
        query's row [Hq, k], already computed by the caller (see :meth:`Recorder.record`)."""
        k_len = key.shape[2]
        pos = self._key_positions(layer, k_len)
        plain = extras is None or (extras.sinks is None and extras.bias is None and k_len <= extras.window)
        check = not self._decode_checked and value is not None and out is not None
        if mask is None and softcap is None and pos is None and plain and not check:
            hq, d, hkv = query.shape[1], query.shape[-1], key.shape[1]
            given = probs if probs is not None else scores
            if given is not None and tuple(given.shape) != (hq, k_len):
                raise ValueError(f"a decode row of shape {tuple(given.shape)} for {hq} heads over {k_len} keys")
            if probs is not None:  # already softmaxed: no scale
                self._pending.append((layer, probs, None))
                return
            if scores is None:
                q = query[0, :, 0].float().reshape(hkv, hq // hkv, d)  # [Hkv, g, D]
                scores = self._step_view(hq * k_len, query.device).view(hkv, hq // hkv, k_len)
                torch.bmm(q, key[0].float().transpose(1, 2), out=scores)
                scores = scores.view(hq, k_len)  # [Hq, k]
            scale = scaling if scaling is not None else 1.0 / math.sqrt(d)
            self._pending.append((layer, scores, float(scale)))
            return
        probs, learned = decode_probs(query, key, mask, scaling, softcap, extras, self.t_total - 1)
        if learned is not None:
            self._learned(layer, probs.device)[:, self.t_total - 1] = learned
        if check:
            check_output(layer, probs[:, None], value, out)
        self._record_decode_row(layer, probs, k_len, pos)

    def _step_view(self, n: int, device) -> torch.Tensor:
        """The next ``n`` floats of this step's score buffer (right after the previous layer's)."""
        used = self._step_used
        if used + n > self._step_scores.numel():  # longer than planned: a new buffer (earlier views stay valid)
            self._step_scores, used = torch.empty(max(2 * n, self._step_scores.numel()), device=device), 0
        self._step_used = used + n
        return self._step_scores[used : used + n]

    def _decode_output(self, layer: int, query, key, value, scaling) -> torch.Tensor:
        """One plain decode query's output [1, 1, Hq, Dv] from its probabilities, which wait (already
        softmaxed) for :meth:`_flush_decode` like the plain path's scores."""
        hq, d, hkv, k_len = query.shape[1], query.shape[-1], key.shape[1], key.shape[2]
        scale = scaling if scaling is not None else 1.0 / math.sqrt(d)
        q = query[0, :, 0].reshape(hkv, hq // hkv, d)  # [Hkv, g, D]
        probs = self._step_view(hq * k_len, query.device).view(hkv, hq // hkv, k_len)
        torch.bmm(q, key[0].transpose(1, 2), out=probs)
        torch.softmax(probs.mul_(scale), dim=-1, out=probs)
        out = torch.bmm(probs, value[0])  # [Hkv, g, Dv]
        self._pending.append((layer, probs.view(hq, k_len), None))
        return out.view(1, 1, hq, -1)

    def _flush_decode(self) -> None:
        """Softmax and reduce the held-back decode scores, one batch per (cache length, scale), and a packed
        step's layers as they came (already probabilities, side by side)."""
        pending, self._pending, self._step_used = self._pending, [], 0
        blocks: list[tuple[slice | list[int], torch.Tensor]] = list(self._pending_blocks)
        self._pending_blocks = []
        groups: dict[tuple[int, float | None], list] = {}
        for layer, scores, scale in pending:
            groups.setdefault((scores.shape[-1], scale), []).append((layer, scores))
        for (_, scale), items in groups.items():
            layers = [i for i, _ in items]
            idx = slice(layers[0], layers[-1] + 1) if layers == list(range(layers[0], layers[-1] + 1)) else layers
            probs = _adjacent(items)  # [n, Hq, k]
            if probs is None:
                probs = torch.stack([sc for _, sc in items])
            if scale is not None:  # scores, not yet probabilities
                probs = torch.softmax(probs.mul_(scale), dim=-1, out=probs)
            blocks.append((idx, probs))
        qpos, f = self.t_total - 1, self.cfg.bin_factor
        for idx, probs in blocks:
            start = self.t_total - probs.shape[-1]
            if start == 0:
                self._keep_turn(idx, probs[:, :, None], qpos)
            self.colsum[idx, :, start : self.t_total] += probs
            self.sink_mass[idx, :, qpos] = probs[..., : max(self.cfg.sink_k - start, 0)].sum(-1)
            b0, binned = bin_positions(probs, start, f, dim=2)  # [n, Hq, nbins]
            self.decode_rows[qpos - self.n_prompt, idx, :, b0 : b0 + binned.shape[2]] = binned.to(torch.float16)

    def _record_decode_row(self, layer: int, probs: torch.Tensor, k_len: int, pos: torch.Tensor | None) -> None:
        """One layer's exact row [Hq, k] into the summaries (masked, soft-capped or evicted caches);
        ``pos``: the keys' absolute positions from an evicting cache, else None."""
        f, qpos = self.cfg.bin_factor, self.t_total - 1
        row = self.decode_rows[qpos - self.n_prompt, layer]  # [Hq, nb] fp16
        if pos is None:  # keys are positions start … t_total-1: plain slices, no scatter
            start = self.t_total - k_len
            if start == 0:
                self._keep_turn(layer, probs[:, None], qpos)
            self.colsum[layer, :, start : self.t_total] += probs
            self.sink_mass[layer, :, qpos] = probs[:, : max(self.cfg.sink_k - start, 0)].sum(-1)
            b0, binned = bin_positions(probs, start, f, dim=1)  # [Hq, nbins]
            row[:, b0 : b0 + binned.shape[1]] = binned
            return
        pos = pos.to(probs.device).repeat_interleave(self.q_heads // pos.shape[0], dim=0)  # [Hq, k]
        self.colsum[layer].scatter_add_(1, pos, probs)
        self.sink_mass[layer, :, qpos] = (probs * (pos < self.cfg.sink_k)).sum(-1)
        binned = torch.zeros(self.q_heads, self.nb, device=probs.device).scatter_add_(1, pos // f, probs)
        row.copy_(binned)


def _adjacent(items: list[tuple[int, torch.Tensor]]) -> torch.Tensor | None:
    """The layers' [Hq, k] scores as one [n, Hq, k] view when they lie back to back in one buffer."""
    first = items[0][1]
    size = first.numel() * first.element_size()
    for i, (_, sc) in enumerate(items):
        if (
            sc.shape != first.shape
            or sc.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()
            or sc.data_ptr() != first.data_ptr() + i * size
        ):
            return None
    return first.as_strided((len(items), *first.shape), (first.numel(), *first.stride()))
