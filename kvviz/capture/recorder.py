"""The recorder that reduces attention on the fly, beside the model's own attention.

While ``installed(model)`` (:mod:`kvviz.capture.attention_fn`) routes a run's attention through the capture
wrapper, the model's output stays its own implementation's, and the recorder reduces the attention
probabilities that output used to what the views need (column sums, sink mass, observation-window
rows, a binned map, one binned row per decode step, each head's learned-sink mass). Probabilities an
implementation returns (eager) are used as they are; otherwise they are recomputed in query chunks
with everything the implementation applied (:mod:`kvviz.capture.attention_math`), and checked against the
layer's output once per phase. For plain causal SDPA in fp32 the recorder's probabilities also give
the layer's output (:meth:`Recorder.own_output`: probabilities × values, checked against SDPA's own on
the last queries), so the attention is computed once. Nothing T×T per head is ever kept for long prompts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from kvviz.capture.attention_math import (
    Extras,
    check_output,
)
from kvviz.capture.decode_rows import DecodeRows
from kvviz.capture.prefill_rows import PROBE_ROWS, PrefillRows
from kvviz.models import CaptureError


@dataclass
class RecorderConfig:
    """What the recorder keeps. ``bin_factor`` positions share one display bin.

    A prefill is scored ``chunk`` queries at a time, but never more than ``chunk_elements`` floats
    at once (the recorder's one scratch buffer).
    """

    sink_k: int = 4
    obs_window: int = 64
    # queries per chunk. Each chunk computes only the keys its queries can see, so several chunks skip most
    # of the causal triangle (a 1,024-token prefill as one chunk computed twice the scores it needed and
    # recorded 2.3× slower); 32 rows lose to per-op overhead
    chunk: int = 128
    bin_factor: int = 1
    # at most 16 MiB of fp32 scores at once: the softmax and reductions after the matmul then read them from
    # the last-level cache (on a 32 MiB L3, a 4,096-token prefill recorded in chunks of 105-120 queries,
    # 15-17 MiB, took 0.7× the time of chunks of 450, 66 MiB, or of 255, 38 MiB)
    chunk_elements: int = 2**22


class RecordsAttention(Protocol):
    """What the capture attention function hands each layer's tensors to: the Recorder, or a lighter stand-in."""

    def record(self, layer: int, *args: Any, **kwargs: Any) -> None: ...  # the arguments Recorder.record takes

    def record_weights(self, layer: int, weights, learned_sinks: bool = False) -> None: ...

    def end_forward(self) -> None: ...


class Recorder(PrefillRows, DecodeRows):
    """Reduces each layer's attention to the Trace's summaries as the model runs.

    Before each forward the generation loop calls :meth:`begin_forward` with the phase ("prefill",
    "decode" or "outputs") and ``t_total`` (tokens seen including the ones being fed), and sets
    ``cache``; positions of cached keys come from a cache layer's ``kv_positions`` ([Hkv, k], for
    evicting caches) or are the last ``k`` positions. A prefix cache gets the first prompt queries'
    probability rows from :meth:`keep_prefix_rows` and gives them back with :meth:`replay_prefix`.
    """

    def __init__(
        self,
        layers: int,
        q_heads: int,
        t_max: int,
        n_prompt: int,
        cfg: RecorderConfig,
        device: torch.device,
        keep_outputs: bool = False,
        attention_layers: list[int] | None = None,
    ):
        if cfg.bin_factor < 1 or cfg.chunk < 1 or cfg.sink_k < 0 or cfg.obs_window < 1:
            raise ValueError("RecorderConfig needs bin_factor, chunk, obs_window >= 1 and sink_k >= 0.")
        self.cfg, self.layers, self.q_heads = cfg, layers, q_heads
        self.t_max, self.n_prompt = t_max, n_prompt
        f = cfg.bin_factor
        self.nb = -(-t_max // f)
        nqb = -(-n_prompt // f)
        w = min(cfg.obs_window, n_prompt)
        self.device = torch.empty(0, device=device).device  # "cuda" → "cuda:0", as tensors report it
        f32 = torch.float32
        self.colsum = torch.zeros(layers, q_heads, t_max, device=device, dtype=f32)  # [Lyr, Hq, T]
        self.prefill_colsum = torch.zeros(layers, q_heads, n_prompt, device=device, dtype=f32)
        self.sink_mass = torch.zeros(layers, q_heads, t_max, device=device, dtype=f32)  # per query position
        self.window_rows = torch.zeros(layers, q_heads, w, n_prompt, device=device, dtype=f32)
        self.prefill_map = torch.zeros(layers, q_heads, nqb, self.nb, device=device, dtype=f32)
        self.decode_rows = torch.zeros(
            max(t_max - n_prompt, 0), layers, q_heads, self.nb, device=device, dtype=torch.float16
        )
        self.phase = "prefill"
        self.t_total = 0
        self.cache: Any = None  # the run's cache: an evicting one says which position each key holds
        self.keep_outputs = keep_outputs
        self.outputs: list[torch.Tensor | None] = []  # per forward: [Lyr, q, Hq*Dv] when keep_outputs
        self._out_step: list[torch.Tensor | None] = [None] * layers
        self._out_blocks: list[tuple[list[int], torch.Tensor]] = []  # a packed step's outputs (record_packed_step)
        self._scratch: torch.Tensor | None = None  # one chunk's scores, then (in place) probabilities
        self._tri: torch.Tensor | None = None  # [C, C] -inf above the diagonal, 0 elsewhere (the causal mask's block)
        self._causal: tuple | None = None  # (mask, k, whether it is plain causal) of the last bool mask seen
        # decode scores (with their scale) or probabilities (scale None) awaiting end_forward
        self._pending: list[tuple[int, torch.Tensor, float | None]] = []
        self._pending_blocks: list[tuple[slice, torch.Tensor]] = []  # a packed step's layers: [n, Hq, k] probabilities
        # one step's decode scores, layer after layer, so a run of layers is one view (no stack, no
        # fresh multi-MB allocation per step); sized for every layer at the longest cache
        self._step_scores = torch.empty(layers * q_heads * t_max, device=device)
        self._step_used = 0
        self.learned_sink_mass: torch.Tensor | None = None  # [Lyr, Hq, T] share on each head's learned sink
        # the layers that attend (None: every one); a linear-attention layer has no attention to reach
        self.attention_layers = list(range(layers)) if attention_layers is None else list(attention_layers)
        self._recorded = [False] * layers  # layers this forward reached (each attending one must)
        self._decode_checked = False  # the first decode step checks every layer's row against its output
        self.prefix_rows: torch.Tensor | None = None  # [Lyr, Hq, P, P]: the first P prompt queries' rows, kept
        self.turn_rows: torch.Tensor | None = None  # [Lyr, Hq, E-S, E]: rows of queries S … E-1, prompt or generated
        self.turn_start = 0  # S

    @property
    def checks_decode(self) -> bool:
        """Whether this recorder's next decode step checks its rows against the layers' outputs (its
        first one does; a packed forward may check many recorders' rows at once, then hands them no values)."""
        return not self._decode_checked

    def begin_forward(self, phase: str, t_total: int) -> None:
        """The next forward's phase ("prefill", "decode" or "outputs": attention outputs only) and the
        tokens seen once it has run."""
        if phase not in ("prefill", "decode", "outputs"):
            raise ValueError(f"unknown recorder phase {phase!r}")
        self.phase, self.t_total = phase, t_total

    # -- the prefix cache's share -------------------------------------------------------------------
    def keep_prefix_rows(self, n: int) -> None:
        """Keep the probability rows of prompt queries ``0 … n-1`` (over keys ``0 … n-1``) as the prefill
        computes them, for a prefix cache to store with the prefix's keys and values."""
        if not 0 < n <= self.n_prompt:
            raise ValueError(f"prefix rows must cover 1 … {self.n_prompt} prompt queries; got {n}.")
        self.prefix_rows = torch.zeros(self.layers, self.q_heads, n, n, device=self.device)

    def keep_turn_rows(self, start: int, end: int) -> None:
        """Keep the probability rows of queries ``start … end-1`` (over keys ``0 … end-1``), prompt and
        generated alike, as the run computes them: a chat's next turn starts from this turn's prompt and
        answer, so a prefix cache stores blocks past the prompt once the run has finished."""
        if not 0 <= start < end <= self.t_max:
            raise ValueError(f"turn rows must lie within 0 … {self.t_max}; got {start} … {end}.")
        self.turn_rows = torch.zeros(self.layers, self.q_heads, end - start, end, device=self.device)
        self.turn_start = start

    def _keep_turn(self, layer, p: torch.Tensor, q0: int) -> None:
        """Copy rows p [..., Hq, q, k] of queries ``q0 …`` over keys ``0 … k-1`` into :attr:`turn_rows`
        where they fall inside it (``layer``: an index, a slice or a list of layers, as ``p`` has them)."""
        kept = self.turn_rows
        if kept is None:
            return
        s = self.turn_start
        lo, hi = max(q0, s), min(q0 + p.shape[-2], s + kept.shape[2])
        if lo < hi:
            k = min(p.shape[-1], kept.shape[3])
            kept[layer, :, lo - s : hi - s, :k] = p[..., lo - q0 : hi - q0, :k]

    def replay_prefix(self, rows: torch.Tensor) -> None:
        """Fold a cached prefix's probability rows [Lyr, Hq, P, P] into the summaries, as if the prefill
        had computed them (the same reduction, in the same query chunks); the prefill then continues
        from position P over the cache the prefix's keys and values were restored into."""
        n = rows.shape[2]
        if rows.shape[:2] != (self.layers, self.q_heads) or not 0 < n < self.n_prompt:
            raise ValueError("cached prefix rows do not fit this run (layers, heads or length).")
        w0 = self.n_prompt - self.window_rows.shape[2]
        step = self._chunk_rows(n)
        rows = rows.to(self.device)
        # a short prefix: every layer's chunks in one reduction; a long one layer by layer
        layers: list[int | slice] = (
            [slice(None)] if rows.numel() <= self.cfg.chunk_elements else list(range(self.layers))
        )
        for layer in layers:
            for a0 in range(0, n, step):
                a1 = min(a0 + step, n)
                self._reduce_chunk(layer, rows[layer, :, a0:a1, :a1], a0, 0, w0)
        self.prefill_colsum.copy_(self.colsum[:, :, : self.n_prompt])

    # -- called from the attention function ------------------------------------------------
    def record(
        self,
        layer: int,
        query,
        key,
        mask,
        scaling,
        softcap,
        out,
        *,
        value=None,
        weights=None,
        sinks=None,
        bias=None,
        sliding_window=None,
        scores=None,
        probs=None,
    ) -> None:
        """One layer's attention call. ``weights``: the probabilities the implementation returned
        (eager), used as they are; otherwise they are recomputed from the query, keys, mask, scaling,
        soft-cap, learned ``sinks`` ([Hq] logits), additive ``bias`` and ``sliding_window``. ``value``
        and ``out`` let the first prefill and decode step check the probabilities against the output.
        ``scores``: a decode query's plain scores q·kᵀ [Hq, k] (fp32, unscaled) when the caller already
        computed them for many sequences at once; used only where the plain decode path applies.
        ``probs``: likewise, that query's probabilities [Hq, k] when the caller also computed the layer's
        output from them (and checked it against the implementation)."""
        self._recorded[layer] = True
        if query.device != self.device:  # a dispatched model's layer on another device hands its tensors over
            query, key, mask, out, value, weights, sinks, bias, scores, probs = (
                x.to(self.device) if isinstance(x, torch.Tensor) else x
                for x in (query, key, mask, out, value, weights, sinks, bias, scores, probs)
            )
        if self.keep_outputs:
            self._out_step[layer] = out[0].reshape(out.shape[1], -1).float()  # [q, Hq*Dv]
        if self.phase == "outputs":
            return
        if weights is not None:
            self.record_weights(layer, weights, learned_sinks=sinks is not None)
            n = min(PROBE_ROWS, weights.shape[2])
            if query.shape[2] > 1 or not self._decode_checked:
                check_output(layer, weights[0, :, -n:].float(), value, out)
            return
        extras = Extras(sinks, bias, sliding_window)
        if query.shape[2] == 1 and self.phase == "decode":  # a prompt token fed alone is a prefill row
            self._record_decode(
                layer, query, key, mask, scaling, softcap, extras if extras else None, value, out, scores, probs
            )
        else:
            self._record_prefill(layer, query, key, mask, scaling, softcap, extras, value, out)

    def own_output(self, layer: int, query, key, value, mask, scaling, probe) -> torch.Tensor | None:
        """The layer's attention output [1, q, Hq, Dv] as probabilities × values, from the probabilities
        this recorder computes anyway, recorded as they are made: a plain causal layer's attention is
        then computed once instead of once by the implementation and again here. None where this does
        not apply (the "outputs" phase, a mask other than causal, an evicting cache's key positions,
        another device, not fp32); the caller then runs the implementation and :meth:`record`.

        ``probe(rows, mask, mine)`` checks ``mine``, this output's last ``rows`` queries, against the
        implementation itself run on them with ``mask`` (a causal call's rows; raising
        :class:`~kvviz.models.CaptureError` when they differ): on every prefill forward and the first
        decode step, so a variant kvviz does not model still fails loudly. A packed forward checks its
        sequences' rows together (:mod:`kvviz.capture.packed`)."""
        k_len, q_len = key.shape[2], query.shape[2]
        if (
            self.phase == "outputs"
            or query.dtype != torch.float32
            or query.device != self.device
            or self._key_positions(layer, k_len) is not None
        ):
            return None
        if q_len == 1 and self.phase == "decode":
            if mask is not None:
                return None
            out = self._decode_output(layer, query, key, value, scaling)
            if not self._decode_checked:
                probe(1, None, out)
        else:
            if mask is not None and not (mask.dtype == torch.bool and self._is_causal(mask, k_len)):
                return None
            emitted = self._record_prefill(layer, query, key, mask, scaling, None, Extras(), value, None, emit=True)
            assert emitted is not None
            out = emitted
            r = min(PROBE_ROWS, q_len)
            rows = mask[:, :, -r:] if mask is not None else _causal_rows(r, k_len, query.device)
            probe(r, rows, out[:, -r:])
        self._recorded[layer] = True
        if self.keep_outputs:
            self._out_step[layer] = out[0].reshape(q_len, -1)  # [q, Hq*Dv]
        return out

    def record_packed_step(self, layers: list[int], outs: torch.Tensor, probs: torch.Tensor, lens: list[int]) -> None:
        """:meth:`record` of one plain decode query in each of ``layers``, after a packed forward computed
        their probabilities and, from them, their outputs (:class:`~kvviz.capture.packed_decode.StepRows`):
        ``outs`` [L, Hq·Dv], ``probs`` [L, Hq, W] (the first ``lens[i]`` of layer i's row are its keys). The
        same state changes as the general path, once per step instead of once per layer, without its
        argument handling. Only after this recorder's first decode step (that one is checked row by row)."""
        if not self._decode_checked:
            raise CaptureError("A packed step's rows came before the first decode step was checked.")
        probs, outs = probs.to(self.device), outs.to(self.device)
        for layer in layers:
            self._recorded[layer] = True
        if self.keep_outputs:
            self._out_blocks.append((layers, outs))
        if self.phase == "outputs":
            return
        k = lens[0]
        cache_layers = getattr(self.cache, "layers", None) or ()
        in_order = all(getattr(c, "kv_positions", None) is None for c in cache_layers)
        if in_order and lens == [k] * len(lens) and layers == list(range(layers[0], layers[0] + len(layers))):
            self._pending_blocks.append((slice(layers[0], layers[-1] + 1), probs[..., :k]))
            return
        for layer, row, n in zip(layers, probs, lens):  # caches that differ by layer: each layer as it is
            pos = self._key_positions(layer, n)
            if pos is None:
                self._pending.append((layer, row[:, :n], None))
            else:
                self._record_decode_row(layer, row[:, :n], n, pos)

    def record_weights(self, layer: int, weights: torch.Tensor, learned_sinks: bool = False) -> None:
        """Probabilities [B, Hq, q, k] the model's own implementation computed, reduced as they are; a
        row summing to less than one gave the rest to its head's learned sink (``learned_sinks``)."""
        self._recorded[layer] = True
        if self.phase == "outputs":
            return
        w = weights[0].to(self.device)
        q_len, k_len = w.shape[1], w.shape[2]
        if q_len == 1 and self.phase == "decode":
            p = w[:, 0].float()  # [Hq, k]
            if learned_sinks:
                self._learned(layer, p.device)[:, self.t_total - 1] = 1 - p.sum(-1)
            self._record_decode_row(layer, p, k_len, self._key_positions(layer, k_len))
            return
        koff, qpos0 = self.t_total - k_len, self.t_total - q_len
        rows = self._chunk_rows(k_len)
        for a0 in range(qpos0 - qpos0 % rows, qpos0 + q_len, rows):
            c0, c1 = max(a0, qpos0) - qpos0, min(a0 + rows, qpos0 + q_len) - qpos0
            p = w[:, c0:c1].float()  # [Hq, C, k]
            if learned_sinks:
                self._learned(layer, p.device)[:, qpos0 + c0 : qpos0 + c1] = 1 - p.sum(-1)
            self._reduce_chunk(layer, p, qpos0 + c0, koff, self.n_prompt - self.window_rows.shape[2])

    def _learned(self, layer: int, device) -> torch.Tensor:
        """This layer's learned-sink shares [Hq, T], allocated for every layer on first use."""
        if self.learned_sink_mass is None:
            self.learned_sink_mass = torch.zeros(self.layers, self.q_heads, self.t_max, device=device)
        return self.learned_sink_mass[layer]

    def end_forward(self) -> None:
        """Close one forward pass: reduce the decode rows held back for it, copy the prompt's column
        sums once the prompt is through, collect attention outputs for the equivalence check."""
        missing = [i for i in self.attention_layers if not self._recorded[i]]
        self._recorded = [False] * self.layers
        if missing:  # the forward is lost: nothing of it is kept (held rows are views of a whole batch's)
            self._pending, self._pending_blocks, self._out_blocks = [], [], []
            raise CaptureError(
                f"Layers {', '.join(map(str, missing[:8]))} ran without reaching kvviz's capture: "
                "their attention bypasses transformers' attention interface."
            )
        self._flush_decode()
        if self.phase == "decode":
            self._decode_checked = True
        if self.phase != "outputs" and 0 < self.t_total <= self.n_prompt:
            self.prefill_colsum.copy_(self.colsum[:, :, : self.n_prompt])  # only prompt queries so far
        if self.keep_outputs:
            blocks, self._out_blocks = self._out_blocks, []
            if len(blocks) == 1 and len(blocks[0][0]) == self.layers:  # every layer from one packed step's call
                self.outputs.append(blocks[0][1][:, None].clone())  # [Lyr, 1, Hq*Dv], its own (not the batch's) memory
                return
            for layers, rows in blocks:
                for layer, out in zip(layers, rows):
                    self._out_step[layer] = out[None].clone()  # its own memory, not the step's batch
            outs = [o for o in self._out_step if o is not None]  # legacy attention hands over no output
            held = len(outs) == len(self._out_step)
            self.outputs.append(torch.stack(outs) if held else None)  # [Lyr, q, Hq*Dv]

    def _key_positions(self, layer: int, k_len: int) -> torch.Tensor | None:
        """Absolute positions of the cached keys ([Hkv, k]) when an evicting cache says so, else None
        (then the keys are the last ``k`` positions, in order)."""
        layers = getattr(self.cache, "layers", None)
        cache_layer = layers[layer] if layers is not None and layer < len(layers) else None
        pos = getattr(cache_layer, "kv_positions", None)
        return pos if pos is not None and pos.shape[-1] == k_len else None

    def _in_order(self, layer: int) -> bool:
        """Whether the layer's cached keys are consecutive positions (no evicting cache's slot map)."""
        layers = getattr(self.cache, "layers", None)
        return layers is None or layer >= len(layers) or getattr(layers[layer], "kv_positions", None) is None


def _causal_rows(rows: int, k_len: int, device) -> torch.Tensor:
    """[1, 1, rows, k] bool mask of a causal call's last ``rows`` queries over its ``k`` keys."""
    pos = torch.arange(k_len - rows, k_len, device=device)[:, None]
    return (torch.arange(k_len, device=device) <= pos)[None, None]
