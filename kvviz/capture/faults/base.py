"""What every fault shares: where it strikes, the cache that lets it in, and the attention it may replace.

A :class:`Fault` breaks kvviz's own cached decoding — never the reference recomputation — at one
decode step and one layer (where the bug allows; a prefix-cache bug strikes every layer of the
prefill). It enters through two transformers interfaces only: :class:`FaultyCache`, a
``DynamicCache`` whose ``update`` hands each layer's new keys and values to the fault before they
are stored, and the capture wrapper's attention override (``forward_kwargs``), which lets the fault
compute a layer's attention instead of the model's implementation. Model code is never patched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from kvviz.capture.attention_fn import OVERRIDE_KWARG


@dataclass(frozen=True)
class Fault:
    """One bug at ``step`` (the forward that strikes first: 0 is the prefill, s ≥ 1 the decode step that
    feeds position n_prompt + s − 1) in ``layer``. Subclasses set the class fields and override hooks."""

    step: int = 1
    layer: int = 0

    name: ClassVar[str] = ""
    title: ClassVar[str] = ""
    source: ClassVar[str] = ""  # the public report of this bug
    lesson: ClassVar[str] = ""  # what went wrong and the fix, in one sentence
    shows: ClassVar[str] = ""  # what the divergence map shows
    first: ClassVar[str] = ""  # which quantity leaves its tolerance first: "K", "V", "attention", "cache length"
    every_layer: ClassVar[bool] = False  # strikes every layer at once (a block table is shared by all layers)
    prefill: ClassVar[bool] = False  # strikes the prefill (step 0); its step is then 0
    once: ClassVar[bool] = False  # strikes at ``step`` only (a missed append), not from it on

    def strikes(self, step: int, layer: int) -> bool:
        """Whether this fault acts in ``layer`` during forward ``step``."""
        here = self.every_layer or layer == self.layer
        return here and (step == self.step if self.once else step >= self.step)

    def start(self, g) -> None:
        """Refuse a run the fault cannot enter — it needs kvviz's own cache, the whole prompt as prefill, and no
        recorder or check (the debugger, :mod:`kvviz.capture.divergence`, compares the run instead) — then
        :meth:`begin` it."""
        if g.rec is not None or g.verify or not g.default_cache:
            raise ValueError(
                "A fault runs on kvviz's own cache with the whole prompt as prefill, without the recorder "
                "(record=False), the check, a cache_factory or an after_step hook."
            )
        self.begin(g)

    # ---- hooks ----------------------------------------------------------------------------------
    def begin(self, g) -> None:
        """Called once when a run starts (a prefix-cache fault restores its blocks here)."""

    def store(self, keys: torch.Tensor, values: torch.Tensor, layer) -> tuple[torch.Tensor, torch.Tensor] | None:
        """New keys and values ([B, Hkv, q, D]) about to be appended when the fault strikes; return the ones to
        store, or None to store nothing (and attend to the stale cache)."""
        return keys, values

    def attend(self, module, query, key, value, scaling: float, window: int | None = None) -> torch.Tensor | None:
        """The layer's attention output ([B, q, Hq, Dv]) when the fault strikes, or None for the model's own
        (``window``: the layer's sliding window, None for full attention)."""
        return None


def expand(key: torch.Tensor, groups: int) -> torch.Tensor:
    """Each KV head repeated for its ``groups`` query heads, in order: [B, Hkv, k, D] → [B, Hkv·groups, k, D]."""
    return key.repeat_interleave(groups, dim=1)


def sdpa(query, key, value, scaling: float, *, causal: bool = False, groups: int | None = None) -> torch.Tensor:
    """Plain attention of ``query`` [B, Hq, q, D] over every key ([B, Hkv, k, D]), KV heads expanded per group;
    returns [B, q, Hq, Dv] as transformers' implementations do."""
    g = query.shape[1] // key.shape[1] if groups is None else groups
    out = F.scaled_dot_product_attention(query, expand(key, g), expand(value, g), is_causal=causal, scale=scaling)
    return out.transpose(1, 2).contiguous()


class FaultyCache(DynamicCache):
    """A ``DynamicCache`` that counts each layer's forwards (the step) and lets ``fault`` act on what it stores
    and on the layer's attention (through the capture wrapper's override)."""

    repositions = False

    def __init__(self, fault: Fault, config):
        super().__init__(config=config)
        self.fault = fault
        self.calls: dict[int, int] = {}  # layer -> forwards seen
        self.restoring = False  # a prefix restore stores without counting a forward

    def step_of(self, layer: int) -> int:
        """The forward the layer is in (0: the prefill)."""
        return self.calls.get(layer, 1) - 1

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        if self.restoring:
            return super().update(key_states, value_states, layer_idx, *args, **kwargs)
        self.calls[layer_idx] = self.calls.get(layer_idx, 0) + 1
        if not self.fault.strikes(self.step_of(layer_idx), layer_idx):
            return super().update(key_states, value_states, layer_idx, *args, **kwargs)
        stored = self.fault.store(
            key_states, value_states, self.layers[layer_idx] if layer_idx < len(self.layers) else None
        )
        if stored is None:  # nothing appended: the layer attends to what it held before
            layer = self.layers[layer_idx]
            return layer.keys, layer.values
        return super().update(stored[0], stored[1], layer_idx, *args, **kwargs)

    def forward_kwargs(self) -> dict:
        return {OVERRIDE_KWARG: self._attention}

    def _attention(self, module, query, key, value, mask, implementation, *args, **kwargs):
        layer = module.layer_idx
        if self.fault.strikes(self.step_of(layer), layer):
            window = kwargs.get("sliding_window") or getattr(module, "sliding_window", None)
            out = self.fault.attend(module, query, key, value, kwargs.get("scaling") or module.scaling, window)
            if out is not None:
                return out, None
        if query.shape[2] == 1 and mask is not None and mask.shape[-1] != key.shape[-2]:
            mask = None  # a layer whose cache length a fault changed: one unpadded query sees every key it holds
        return implementation(module, query, key, value, mask, *args, **kwargs)
