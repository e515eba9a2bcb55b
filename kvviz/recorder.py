"""The capture attention function and the recorder that reduces attention on the fly.

``installed(model)`` registers ``kvviz_capture`` with transformers' AttentionInterface for the
duration of a run: the model's output is still computed by transformers' own SDPA function, and
beside it the recorder computes attention probabilities in query chunks and keeps only what the
views need (column sums, sink mass, observation-window rows, a binned map, one binned row per
decode step). Nothing T×T per head is ever kept for long prompts.
"""

from __future__ import annotations

import math
import threading
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

NAME = "kvviz_capture"
RECORDER_KWARG = "kvviz_recorder"
_lock = threading.Lock()
_users: dict[int, list] = {}  # id(model) -> [count, previous attn implementation]


def capture_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """SDPA output, plus a call to the run's recorder (if any) with the same tensors.

    query: [B, Hq, q, D]; key/value: [B, Hkv, k, D] (the whole cache for this layer).
    """
    recorder = kwargs.pop(RECORDER_KWARG, None)
    softcap = kwargs.get("softcap")
    if softcap is not None:  # SDPA has no soft-capping (Gemma-2): use the exact eager formula
        probs = attention_probs(query, key, attention_mask, scaling, softcap, kwargs.get("sliding_window"))
        out = torch.matmul(probs.to(value.dtype), repeat_kv(value, query.shape[1] // key.shape[1]))
        out = out.transpose(1, 2).contiguous()  # [B, q, Hq, D], as sdpa_attention_forward returns
    else:
        kwargs.pop("softcap", None)
        out, _ = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                        scaling=scaling, **kwargs)
    if recorder is not None:
        recorder.record(module.layer_idx, query, key, attention_mask, scaling, softcap, out)
    return out, None


def attention_probs(query, key, mask, scaling, softcap=None, sliding_window=None, q_offset=None):
    """Exact softmax(QKᵀ·scale + mask) in fp32: [B, Hq, q, k].

    ``mask`` is what transformers passes (bool: True = attend; float: additive; None = causal with
    the queries being the last ``q`` positions of the keys, or ``q_offset`` if given).
    """
    group = query.shape[1] // key.shape[1]
    k = repeat_kv(key, group).float()  # [B, Hq, k, D]
    scores = torch.matmul(query.float(), k.transpose(-1, -2))  # [B, Hq, q, k]
    scores = scores * (scaling if scaling is not None else 1.0 / math.sqrt(query.shape[-1]))
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    q_len, k_len = scores.shape[-2:]
    if mask is None:
        if q_len > 1:
            offset = k_len - q_len if q_offset is None else q_offset
            qpos = torch.arange(q_len, device=scores.device)[:, None] + offset
            kpos = torch.arange(k_len, device=scores.device)[None, :]
            allowed = kpos <= qpos
            if sliding_window is not None:
                allowed &= kpos > qpos - sliding_window
            scores = scores.masked_fill(~allowed, float("-inf"))
    elif mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask[..., :k_len], float("-inf"))
    else:
        scores = scores + mask[..., :k_len].float()
    return torch.softmax(scores, dim=-1)


@contextmanager
def installed(model):
    """Route ``model``'s attention through :func:`capture_attention` for the block, then restore.

    Re-entrant and thread-safe: concurrent runs on one shared model share the installation, and
    the last one out puts the previous implementation back.
    """
    with _lock:
        AttentionInterface.register(NAME, capture_attention)
        if NAME not in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:
            ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
        entry = _users.setdefault(id(model), [0, model.config._attn_implementation])
        if entry[0] == 0:
            entry[1] = model.config._attn_implementation
            model.set_attn_implementation(NAME)
        entry[0] += 1
    try:
        yield
    finally:
        with _lock:
            entry[0] -= 1
            if entry[0] == 0:
                model.set_attn_implementation(entry[1])
                _users.pop(id(model), None)


def is_installed(model) -> bool:
    """True while a capture is routing this model's attention (tests check it is gone after)."""
    return model.config._attn_implementation == NAME


@dataclass
class RecorderConfig:
    """What the recorder keeps. ``bin_factor`` positions share one display bin."""

    sink_k: int = 4
    obs_window: int = 64
    chunk: int = 256
    bin_factor: int = 1


class Recorder:
    """Reduces each layer's attention to the Trace's summaries as the model runs.

    The capture loop sets ``phase`` ("prefill"/"decode"), ``t_total`` (tokens seen including the
    ones being fed) and ``cache`` before each forward; positions of cached keys come from a cache
    layer's ``kv_positions`` ([Hkv, k], for evicting caches) or are the last ``k`` positions.
    """

    def __init__(self, layers: int, q_heads: int, t_max: int, n_prompt: int, cfg: RecorderConfig,
                 device: torch.device, keep_outputs: bool = False):
        self.cfg, self.layers, self.q_heads = cfg, layers, q_heads
        self.t_max, self.n_prompt = t_max, n_prompt
        f = cfg.bin_factor
        self.nb = -(-t_max // f)
        nqb = -(-n_prompt // f)
        w = min(cfg.obs_window, n_prompt)
        z = dict(device=device, dtype=torch.float32)
        self.colsum = torch.zeros(layers, q_heads, t_max, **z)  # [Lyr, Hq, T]
        self.prefill_colsum = torch.zeros(layers, q_heads, n_prompt, **z)
        self.sink_mass = torch.zeros(layers, q_heads, t_max, **z)  # per query position
        self.window_rows = torch.zeros(layers, q_heads, w, n_prompt, **z)
        self.prefill_map = torch.zeros(layers, q_heads, nqb, self.nb, **z)
        self.decode_rows = torch.zeros(max(t_max - n_prompt, 0), layers, q_heads, self.nb,
                                       device=device, dtype=torch.float16)
        self.phase = "prefill"
        self.t_total = 0
        self.cache = None
        self.keep_outputs = keep_outputs
        self.outputs: list[torch.Tensor] = []  # per forward: [Lyr, q, Hq*D] when keep_outputs
        self._out_step: list[torch.Tensor | None] = [None] * layers

    # -- called from the attention function ------------------------------------------------
    def record(self, layer: int, query, key, mask, scaling, softcap, out) -> None:
        if self.keep_outputs:
            self._out_step[layer] = out[0].reshape(out.shape[1], -1).float()  # [q, Hq*D]
        if self.phase == "outputs":
            return
        if query.shape[2] == 1:
            self._record_decode(layer, query, key, mask, scaling, softcap)
        else:
            self._record_prefill(layer, query, key, mask, scaling, softcap)

    def end_forward(self) -> None:
        """Close one forward pass (collects attention outputs for the equivalence check)."""
        if self.keep_outputs:
            self.outputs.append(torch.stack(self._out_step))  # [Lyr, q, Hq*D]

    def _key_positions(self, layer: int, k_len: int, hkv: int) -> torch.Tensor:
        """Absolute position of every cached key: [Hkv, k]."""
        cache_layer = self.cache.layers[layer] if self.cache is not None else None
        pos = getattr(cache_layer, "kv_positions", None)
        if pos is not None and pos.shape[-1] == k_len:
            return pos
        start = self.t_total - k_len
        return torch.arange(start, self.t_total, device=self.colsum.device).expand(hkv, k_len)

    def _record_decode(self, layer, query, key, mask, scaling, softcap) -> None:
        probs = attention_probs(query, key, mask, scaling, softcap)[0, :, 0]  # [Hq, k]
        pos = self._key_positions(layer, key.shape[2], key.shape[1])
        pos = pos.repeat_interleave(self.q_heads // key.shape[1], dim=0)  # [Hq, k]
        self.colsum[layer].scatter_add_(1, pos, probs)
        qpos = self.t_total - 1
        self.sink_mass[layer, :, qpos] = (probs * (pos < self.cfg.sink_k)).sum(-1)
        binned = torch.zeros(self.q_heads, self.nb, device=probs.device).scatter_add_(
            1, pos // self.cfg.bin_factor, probs)
        self.decode_rows[qpos - self.n_prompt, layer] = binned.half()

    def _record_prefill(self, layer, query, key, mask, scaling, softcap) -> None:
        q_len, k_len = query.shape[2], key.shape[2]
        f, n_prompt = self.cfg.bin_factor, self.n_prompt
        w = self.window_rows.shape[2]
        qpos0 = self.t_total - q_len  # absolute position of the first query
        for c0 in range(0, q_len, self.cfg.chunk):
            c1 = min(c0 + self.cfg.chunk, q_len)
            kend = min(k_len, (k_len - q_len) + c1)  # causal: this chunk sees no later key
            m = None if mask is None else mask[:, :, c0:c1, :kend]
            probs = attention_probs(query[:, :, c0:c1], key[:, :, :kend], m, scaling, softcap,
                                    q_offset=(k_len - q_len) + c0)[0]  # [Hq, C, kend]
            self.colsum[layer, :, :kend] += probs.sum(1)
            if qpos0 == 0:
                self.prefill_colsum[layer, :, :kend] += probs.sum(1)
            qs = torch.arange(qpos0 + c0, qpos0 + c1, device=probs.device)
            self.sink_mass[layer, :, qs] = probs[..., : self.cfg.sink_k].sum(-1)
            lo = max(c0, n_prompt - w)
            if lo < c1:
                self.window_rows[layer, :, lo - (n_prompt - w):c1 - (n_prompt - w), :kend] = probs[:, lo - c0:]
            # display map: mass per key bin, summed over the queries of each query bin
            nkb = -(-kend // f)
            padded = torch.nn.functional.pad(probs, (0, nkb * f - kend))
            kbinned = padded.view(self.q_heads, c1 - c0, nkb, f).sum(-1)  # [Hq, C, nkb]
            self.prefill_map[layer, :, :, :nkb].index_add_(1, qs // f, kbinned)

    def finish_prefill_map(self) -> torch.Tensor:
        """Mean row per query bin (each row of the map then sums to 1)."""
        f, n = self.cfg.bin_factor, self.n_prompt
        counts = torch.bincount(torch.arange(n) // f, minlength=self.prefill_map.shape[2]).clamp(min=1)
        return self.prefill_map / counts.to(self.prefill_map.device)[None, None, :, None]
