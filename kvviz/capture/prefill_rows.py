"""A prefill's attention rows, reduced chunk by chunk as they are computed.

:class:`PrefillRows`, a part of :class:`~kvviz.capture.recorder.Recorder` (as
:class:`~kvviz.capture.decode_rows.DecodeRows` is for decode steps), scores a call's queries in chunks of
at most ``chunk`` rows and ``chunk_elements`` floats (one scratch buffer, kept), applies what the
implementation applied (soft-cap, bias, causal or explicit masks, windows, learned sinks), softmaxes
in place and folds each chunk into the column sums, sink mass, observation-window rows and the binned
map; the call's last queries are checked against the layer's output.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from kvviz.capture.attention_math import Extras, check_output, is_causal, mask_window_, softmax_
from kvviz.capture.binning import bin_positions
from kvviz.capture.decode_rows import RowsConfig

PROBE_ROWS = 8  # query rows per layer whose probabilities are checked against the layer's output


class PrefillRows:
    """The Recorder's prefill reductions (its state is the Recorder's; see there)."""

    if TYPE_CHECKING:  # what the Recorder provides
        cfg: RowsConfig
        q_heads: int
        n_prompt: int
        t_total: int
        colsum: torch.Tensor
        sink_mass: torch.Tensor
        window_rows: torch.Tensor
        prefill_map: torch.Tensor
        prefix_rows: torch.Tensor | None
        _scratch: torch.Tensor | None
        _tri: torch.Tensor | None
        _causal: tuple | None

        phase: str
        device: torch.device
        keep_outputs: bool
        _out_step: list[torch.Tensor | None]
        _recorded: list[bool]

        def _learned(self, layer: int, device) -> torch.Tensor: ...

        def _key_positions(self, layer: int, k_len: int) -> torch.Tensor | None: ...

        def _in_order(self, layer: int) -> bool: ...

        def _keep_turn(self, layer, p: torch.Tensor, q0: int) -> None: ...

    def _chunk_rows(self, k_len: int) -> int:
        """Queries per chunk: cfg.chunk, at most ~chunk_elements scores, a multiple of bin_factor."""
        f = self.cfg.bin_factor
        rows = min(self.cfg.chunk, max(self.cfg.chunk_elements // (self.q_heads * k_len), 16))
        return max(rows // f, 1) * f

    def _buffer(self, n: int, device) -> torch.Tensor:
        """Flat fp32 scratch for one chunk's scores, kept across layers and chunks (a fresh large
        buffer per chunk would cost page faults every time)."""
        if self._scratch is None or self._scratch.numel() < n or self._scratch.device != device:
            self._scratch = torch.empty(n, device=device)
        return self._scratch

    def _record_prefill(
        self, layer, query, key, mask, scaling, softcap, extras: Extras, value, out, emit: bool = False
    ) -> torch.Tensor | None:
        """Score, softmax and reduce the call's queries chunk by chunk; with ``emit``, also return the
        attention output [1, q, Hq, Dv] (each chunk's probabilities × values)."""
        hq, q_len, d = query.shape[1:]
        hkv, k_len = key.shape[1], key.shape[2]
        g = hq // hkv
        koff = self.t_total - k_len  # absolute position of key 0
        qpos0 = self.t_total - q_len  # absolute position of query 0
        qk = k_len - q_len  # keys before query 0 (causal: query r sees keys < qk + r + 1)
        scale = scaling if scaling is not None else 1.0 / math.sqrt(d)
        qs = (query[0].float() * scale).view(hkv, g, q_len, d)  # [Hkv, g, q, D]
        kt = key[0].float().transpose(1, 2)  # [Hkv, D, k]
        rows = self._chunk_rows(k_len)
        sbuf = self._buffer(hq * rows * k_len, query.device)
        w = self.window_rows.shape[2]
        w0 = self.n_prompt - w  # absolute position of the first window query
        causal = mask is None or (mask.dtype == torch.bool and self._is_causal(mask, k_len))
        first = qpos0 - qpos0 % rows  # chunks start at multiples of ``rows`` (so of f) in absolute positions
        emitted = torch.empty(q_len, hq, value.shape[-1], device=query.device) if emit else None
        vals = value[0].float() if emit else None
        for a0 in range(first, qpos0 + q_len, rows):
            c0, c1 = max(a0, qpos0) - qpos0, min(a0 + rows, qpos0 + q_len) - qpos0
            n, kend = c1 - c0, min(k_len, qk + c1)  # this chunk sees no later key
            qc = qs[:, :, c0:c1].reshape(hkv, g * n, d)  # [Hkv, g*C, D] (small copy)
            s = sbuf[: hq * n * kend].view(hkv, g * n, kend)
            torch.bmm(qc, kt[:, :, :kend], out=s)
            s = s.view(hq, n, kend)  # [Hq, C, kend]; head h = kv*g + j, as repeat_kv orders them
            if softcap is not None:
                s.div_(softcap).tanh_().mul_(softcap)
            if extras.bias is not None:
                s.add_(extras.bias[0, :, c0:c1, :kend].float())
            if causal:  # only the diagonal block has masked entries (adding 0 or -inf: exact, and vectorized)
                s[:, :, kend - n :].add_(self._tri_block(n, query.device))
                if mask is None and extras.window is not None:
                    mask_window_(s, qpos0 + c0, koff, extras.window)
            elif mask.dtype == torch.bool:
                s.masked_fill_(~mask[0, :, c0:c1, :kend], float("-inf"))
            else:
                s.add_(mask[0, :, c0:c1, :kend].float())
            learned = softmax_(s, extras.sinks)  # in place: the CPU/GPU kernels work row by row
            if learned is not None:
                self._learned(layer, s.device)[:, qpos0 + c0 : qpos0 + c1] = learned
            if emitted is not None and vals is not None:
                o = torch.bmm(s.view(hkv, g * n, kend), vals[:, :kend])  # [Hkv, g*C, Dv]
                emitted[c0:c1] = o.view(hq, n, -1).transpose(0, 1)
            elif c1 == q_len:  # the call's last queries: do these probabilities give the layer's output?
                check_output(layer, s[:, -min(PROBE_ROWS, n) :], value, out)
            self._reduce_chunk(layer, s, qpos0 + c0, koff, w0)
        return emitted.unsqueeze(0) if emitted is not None else None

    def takes_prefill(self, layer: int, q_len: int, key: torch.Tensor, mask) -> bool:
        """Whether a packed forward may compute this prefill call's probabilities and output for this recorder
        (:mod:`kvviz.capture.packed_prefill`) and hand them over (:meth:`take_prefill`): where :meth:`own_output`
        would compute them itself — fp32 keys in order on this device, a causal mask — for several queries."""
        k_len = key.shape[2]
        return (
            q_len > 1
            and self.phase != "outputs"
            and key.dtype == torch.float32
            and key.device == self.device
            and self._key_positions(layer, k_len) is None
            and (mask is None or (mask.dtype == torch.bool and self._is_causal(mask, k_len)))
        )

    def take_prefill(self, layer: int, probs: torch.Tensor, out: torch.Tensor) -> None:
        """:meth:`own_output` of a prefill call whose probabilities ``probs`` [Hq, q, k] and output ``out``
        [1, q, Hq, Dv] a packed forward computed (:meth:`takes_prefill` said so): reduced in the chunks this
        recorder's own loop uses, so its summaries are the same."""
        q_len, k_len = probs.shape[1], probs.shape[2]
        koff, qpos0 = self.t_total - k_len, self.t_total - q_len
        rows, w0 = self._chunk_rows(k_len), self.n_prompt - self.window_rows.shape[2]
        for a0 in range(qpos0 - qpos0 % rows, qpos0 + q_len, rows):
            c0, c1 = max(a0, qpos0) - qpos0, min(a0 + rows, qpos0 + q_len) - qpos0
            self._reduce_chunk(layer, probs[:, c0:c1, : min(k_len, k_len - q_len + c1)], qpos0 + c0, koff, w0)
        self._recorded[layer] = True
        if self.keep_outputs:
            self._out_step[layer] = out[0].reshape(q_len, -1)

    def _is_causal(self, mask: torch.Tensor, k_len: int) -> bool:
        """:func:`is_causal` of a bool mask, checked once per mask (layers share it; it is held, so no
        later mask can have its identity)."""
        if self._causal is None or self._causal[0] is not mask or self._causal[1] != k_len:
            self._causal = (mask, k_len, is_causal(mask, k_len))
        return self._causal[2]

    def _tri_block(self, n: int, device) -> torch.Tensor:
        """[n, n] additive causal block: -inf above the diagonal, 0 elsewhere."""
        if self._tri is None or self._tri.shape[0] < n or self._tri.device != device:
            self._tri = torch.full((n, n), float("-inf"), device=device).triu(1)
        return self._tri[:n, :n]

    def _reduce_chunk(self, layer: int | slice, p: torch.Tensor, a0: int, koff: int, w0: int) -> None:
        """Fold one chunk's probabilities p [Hq, C, kend] (queries from absolute position a0, keys
        from koff) into the column sums, sink mass, window rows and the binned map; with ``layer`` a
        slice of layers (keys from 0), p is [layers, Hq, C, kend]."""
        qd = p.dim() - 2  # the query dimension
        n, kend, f = p.shape[qd], p.shape[qd + 1], self.cfg.bin_factor
        kept = self.prefix_rows
        if kept is not None and a0 < kept.shape[2] and koff == 0:  # rows the prefix cache will store
            hi = min(a0 + n, kept.shape[2])
            kept[layer, :, a0:hi, : min(kend, kept.shape[3])] = p[..., : hi - a0, : kept.shape[3]]
        if koff == 0:
            self._keep_turn(layer, p, a0)
        self.sink_mass[layer, :, a0 : a0 + n] = p[..., : max(self.cfg.sink_k - koff, 0)].sum(-1)
        # keys koff… in order: from 0, or a sliding layer's window in a later prefill chunk (earlier keys got 0)
        in_order = koff == 0 or (isinstance(layer, int) and self._in_order(layer))
        if a0 + n > w0 and a0 < self.n_prompt and in_order:
            lo, hi = max(a0, w0), min(a0 + n, self.n_prompt)
            self.window_rows[layer, :, lo - w0 : hi - w0, koff : koff + kend] = p[..., lo - a0 : hi - a0, :]
        qb0, qbinned = bin_positions(p, a0, f, dim=qd)  # [..., Hq, nqb_chunk, kend]: mass summed over each query bin
        col = qbinned.sum(qd)  # [..., Hq, kend]: every query of the chunk, once
        self.colsum[layer, :, koff : koff + kend] += col
        if a0 >= self.n_prompt:
            return
        if a0 + n > self.n_prompt:  # a feed that runs past the prompt: keep only the prompt queries
            qb0, qbinned = bin_positions(p[..., : self.n_prompt - a0, :], a0, f, dim=qd)
        kb0, binned = bin_positions(qbinned, koff, f, dim=qd + 1)  # [..., Hq, nqb_chunk, nkb]
        self.prefill_map[layer, :, qb0 : qb0 + binned.shape[qd], kb0 : kb0 + binned.shape[qd + 1]] += binned

    def finish_prefill_map(self) -> torch.Tensor:
        """Mean row per query bin (each row of the map then sums to 1)."""
        f, n = self.cfg.bin_factor, self.n_prompt
        counts = torch.bincount(torch.arange(n) // f, minlength=self.prefill_map.shape[2]).clamp(min=1)
        return self.prefill_map / counts.to(self.prefill_map.device)[None, None, :, None]
