"""A KV cache that quantizes as it stores, and what that does to the answer.

``QuantizedKVCache`` is a transformers ``DynamicCache`` whose layers round-trip every entry through
a :class:`kvviz.quant.schemes.Scheme` when it is stored (KIVI's full-precision recent window included), so
generation really runs on a quantized cache. Usage::

    from kvviz.capture.loop import capture
    from kvviz.quant.schemes import kivi
    from kvviz.quant.cache import cache_factory, compare_generation
    trace = capture(lm, "Tell me a story.", cache_factory=cache_factory(kivi(2)))
    compare_generation(lm, "Tell me a story.", kivi(2), max_new_tokens=24)   # agreement, texts side by side

Simulated: the stored tensors hold the dequantized values in the model's dtype, so their own byte
count is the unquantized one; :meth:`QuantizedKVCache.packed_bytes` counts what a packed store holds.
As in serving engines (and transformers' ``QuantizedLayer``), the tokens of the forward that adds
them attend to their own exact K/V; every later step reads them back quantized.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from kvviz.capture.drive import forwards
from kvviz.capture.generation import Generation
from kvviz.capture.loop import capture
from kvviz.capture.model_io import encode_prompt
from kvviz.capture.options import CacheSetup, Decode, Feed, Recording
from kvviz.models import LoadedModel
from kvviz.quant.schemes import QuantSpec, Scheme, quantized_prefix, rotated, round_trip, stored_bytes, unrotated


class QuantizedLayer(DynamicLayer):
    """One layer's cache: entries older than the spec's window are stored as their quantized round trip.

    Under a rotating spec the layer stores every entry turned by the Hadamard rotation (``x H``), quantizes
    it there, and turns what it hands to attention back (``Hᵀ``) on every read: the stored tensors are the
    rotated, quantized keys a QuaRot-style cache holds, and attention sees q·k unchanged.
    """

    def __init__(self, scheme: Scheme):
        for spec in (scheme.key, scheme.value):
            if spec.axis == "tensor":
                raise ValueError(
                    "A per-tensor scale needs the whole tensor up front; in a cache that grows "
                    "use per-token or per-channel groups."
                )
            if spec.axis == "channel" and not spec.group_size:
                raise ValueError("Per-channel quantization in a growing cache needs a group size (tokens per group).")
        super().__init__()
        self.scheme = scheme
        self.quantized_keys = 0  # tokens [0, n) of keys are stored quantized
        self.quantized_values = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Append, return old (quantized) + new (exact) entries, then quantize what left the window."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        held_k, held_v = self.keys, self.values
        if held_k is None or held_v is None:
            raise RuntimeError("lazy_initialization left the layer without tensors.")
        k_spec, v_spec = self.scheme.key, self.scheme.value
        keys = torch.cat([_read(held_k, k_spec), key_states], dim=-2)  # [B, Hkv, t, D]: what attention sees
        values = torch.cat([_read(held_v, v_spec), value_states], dim=-2)
        self.keys = torch.cat([held_k, _write(key_states, k_spec)], dim=-2)  # as stored (rotated if the spec is)
        self.values = torch.cat([held_v, _write(value_states, v_spec)], dim=-2)
        self.quantized_keys = _settle(self.keys, _stored(k_spec), self.quantized_keys)
        self.quantized_values = _settle(self.values, _stored(v_spec), self.quantized_values)
        return keys, values

    def reset(self) -> None:
        super().reset()
        self.quantized_keys = self.quantized_values = 0


def _write(x: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """New entries as the layer stores them: turned by the Hadamard rotation when the spec rotates."""
    return rotated(x).to(x.dtype) if spec.rotate else x.clone()


def _read(x: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """Stored entries as attention reads them: turned back when the spec rotates."""
    return unrotated(x).to(x.dtype) if spec.rotate and x.numel() else x


def _stored(spec: QuantSpec) -> QuantSpec:
    """The spec the stored (already rotated) entries are quantized with."""
    return dataclasses.replace(spec, rotate=False) if spec.rotate else spec


def _settle(x: torch.Tensor, spec: QuantSpec, done: int) -> int:
    """Quantize, in place, the tokens that have just left the full-precision window; return the new count."""
    n = quantized_prefix(x.shape[-2], spec)
    if n > done:  # per-channel: [done, n) is a whole number of groups, aligned at multiples of group_size
        x[..., done:n, :] = round_trip(x[..., done:n, :], spec).to(x.dtype)
    return n


class QuantizedKVCache(DynamicCache):
    """A DynamicCache whose every layer is a :class:`QuantizedLayer` under one scheme."""

    def __init__(self, config, scheme: Scheme):
        super().__init__(config=config)
        if any(getattr(layer, "is_sliding", False) for layer in self.layers):
            raise ValueError(
                "The quantized cache supports full-attention models only (this one has sliding-window layers)."
            )
        self.scheme = scheme
        self.layers = [QuantizedLayer(scheme) for _ in self.layers]

    def packed_bytes(self) -> int:
        """Bytes a packed store of the current entries would take (payload, fp16 scales, 16-bit window)."""
        total = 0
        for layer in self.layers:
            keys = getattr(layer, "keys", None)
            if keys is None or keys.numel() == 0:
                continue
            shape = tuple(keys.shape)
            total += stored_bytes(shape, self.scheme.key).total + stored_bytes(shape, self.scheme.value).total
        return total


def cache_factory(scheme: Scheme) -> Callable[[LoadedModel], QuantizedKVCache]:
    """For ``capture_iter(cache_factory=...)``: a fresh quantized cache per run."""
    return lambda lm: QuantizedKVCache(lm.config, scheme)


# ---- next-token agreement -----------------------------------------------------------------------
@dataclass
class GenerationComparison:
    """Full-precision vs quantized cache on one prompt (greedy)."""

    scheme: Scheme
    full_text: str
    quant_text: str
    full_tokens: list[str]
    quant_tokens: list[str]
    agreement: float  # top-1 agreement along the full cache's continuation, fraction
    mean_kl: float  # mean KL(full ‖ quantized) of next-token distributions, nats
    steps: int
    first_divergence: int | None  # first generated index where the free-running texts differ
    full_cache_bytes: int  # the same entries in 16-bit
    packed_bytes: int  # what the quantized store holds after the quantized run

    def side_by_side(self) -> list[dict]:
        """Token-by-token rows (for a table): step, full-precision token, quantized token, same?"""
        n = max(len(self.full_tokens), len(self.quant_tokens))
        rows = []
        for i in range(n):
            a = self.full_tokens[i] if i < len(self.full_tokens) else ""
            b = self.quant_tokens[i] if i < len(self.quant_tokens) else ""
            rows.append({"step": i + 1, "full precision": a, "quantized": b, "same": a == b})
        return rows


def forced_logits(lm: LoadedModel, ids: list[int], continuation: list[int], factory: Callable | None) -> list:
    """Next-token logits [vocab] after the prompt and after each fed token of ``continuation`` (one forced run of
    the solo driver on the cache ``factory`` makes; None: the full cache)."""
    g = Generation(
        lm,
        "",
        feed=Feed(prompt_ids=ids, forced=continuation, prefill_chunk=0),
        decode=Decode(max_new_tokens=len(continuation)),
        recording=Recording(on=False),
        cache=CacheSetup(factory=factory),
    )
    return [f.logits[-1] for f in forwards(lm, g, wrapped=False)]


def perplexity(lm: LoadedModel, ids: list[int], n_context: int, scheme: Scheme | None) -> float:
    """exp(mean NLL) of ``ids[n_context:]``, each token predicted from a cache that holds everything before it
    under ``scheme`` (None: the full cache); the first ``n_context`` tokens are the prefill."""
    if not 1 <= n_context < len(ids) - 1:
        raise ValueError(f"Perplexity needs a context of 1…{len(ids) - 2} tokens before the scored ones.")
    rest = ids[n_context:]
    logits = forced_logits(lm, ids[:n_context], rest, None if scheme is None else cache_factory(scheme))
    with torch.inference_mode():
        nll = [-float(torch.log_softmax(x.float(), -1)[t]) for x, t in zip(logits, rest)]
    return float(np.exp(np.mean(nll)))


def teacher_forced(lm: LoadedModel, ids: list[int], continuation: list[int], scheme: Scheme) -> tuple[float, float]:
    """Feed the full cache's continuation to both caches (two forced runs of the solo driver, one after
    the other); top-1 agreement and mean KL at every step."""
    if not continuation:
        return 0.0, 0.0
    full, quant = (
        forced_logits(lm, ids, continuation, None),
        forced_logits(lm, ids, continuation, cache_factory(scheme)),
    )
    agree, kls = [], []
    with torch.inference_mode():
        for a, b in zip(full, quant):
            agree.append(int(a.argmax()) == int(b.argmax()))
            pa, lb = torch.log_softmax(a, -1), torch.log_softmax(b, -1)
            kls.append(float((pa.exp() * (pa - lb)).sum()))
    n = max(len(agree), 1)
    return sum(agree) / n, sum(kls) / n


def compare_generation(
    lm: LoadedModel,
    prompt: str,
    scheme: Scheme,
    max_new_tokens: int = 24,
    chat: bool = True,
    ids: list[int] | None = None,
) -> GenerationComparison:
    """Generate with the full cache and with the quantized one (both through ``capture``), then score."""
    ids = list(ids) if ids is not None else encode_prompt(lm, prompt, chat)
    cache_holder: list[QuantizedKVCache] = []

    def factory(model: LoadedModel) -> QuantizedKVCache:
        cache_holder.append(QuantizedKVCache(model.config, scheme))
        return cache_holder[-1]

    full = capture(lm, prompt, chat=chat, max_new_tokens=max_new_tokens, prompt_ids=ids)
    quant = capture(lm, prompt, chat=chat, max_new_tokens=max_new_tokens, prompt_ids=ids, cache_factory=factory)
    full_ids, quant_ids = full.token_ids[full.n_prompt :], quant.token_ids[quant.n_prompt :]
    agreement, kl = teacher_forced(lm, ids, full_ids, scheme)
    diverge = next(
        (i for i, (a, b) in enumerate(zip(full_ids, quant_ids)) if a != b),
        None if len(full_ids) == len(quant_ids) else min(len(full_ids), len(quant_ids)),
    )
    last = full.steps[-1]
    full16 = sum(last.layer_bytes) * 2 // full.model.bytes_per_element
    return GenerationComparison(
        scheme,
        full.text,
        quant.text,
        full.tokens[full.n_prompt :],
        quant.tokens[quant.n_prompt :],
        agreement,
        kl,
        len(full_ids),
        diverge,
        full16,
        cache_holder[-1].packed_bytes(),
    )
