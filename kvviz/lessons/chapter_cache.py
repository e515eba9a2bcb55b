"""The chapter's own check on the real model: its ``KVCache.append`` / ``attend`` code on layer 0's weights.

The chapter's code builds one attention layer with random weights, prefills 8 tokens into a
``KVCache``, decodes 4 more one at a time with ``causal=False``, and compares with a full recompute
(``print("cache shape:", …, "max diff:", …)``). Here the same code path runs on the bundled model's
layer 0 — its input norm, its Q/K/V projections (GQA: 9 query heads share 3 KV heads, head dim 64)
and its rotary embedding — over two real sentences of 12 tokens, and once more with ``causal=True``
in decode, the trap the chapter names: a single query under SDPA's top-left causal mask sees only the
first key. Usage::

    from kvviz.lessons.chapter_cache import chapter_check
    print(chapter_check(load_model()).text())

Command: ``python -m kvviz check --chapter``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from kvviz.models import LoadedModel

PROMPT, TOTAL = 8, 12  # the chapter's 8 prompt tokens + 4 "generated"
SENTENCES = (
    "The key-value cache stores every past token's keys and values so that decoding",
    "Attention lets each new token look back at all of the tokens that came before it",
)


class KVCache:
    """The chapter's cache: keys and values concatenated along the sequence, [B, n_kv, t, d_h]."""

    def __init__(self):
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        return self.k, self.v


@dataclass(frozen=True)
class ChapterCheck:
    """The chapter's two printed numbers, and the second with ``causal=True`` in decode."""

    cache_shape: tuple[int, ...]
    max_diff: float
    max_diff_causal_decode: float
    q_heads: int
    kv_heads: int

    def text(self) -> str:
        return (
            f"cache shape: {self.cache_shape} max diff: {self.max_diff}\n"
            f"with causal=True in decode: cache shape: {self.cache_shape} max diff: {self.max_diff_causal_decode}"
        )


def layer0_input(lm: LoadedModel, ids: torch.Tensor) -> torch.Tensor:
    """Layer 0's attention input for token ids [B, S]: the embeddings through its input norm, [B, S, d_model]."""
    base: Any = lm.model.base_model  # a decoder with .layers, .embed_tokens, .rotary_emb
    return base.layers[0].input_layernorm(base.embed_tokens(ids))


def project(lm: LoadedModel, x: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The chapter's ``project`` with layer 0's weights and rotary embedding at positions ``start…``:
    q [B, n_q, S, d_h], k and v [B, n_kv, S, d_h]."""
    base: Any = lm.model.base_model  # a decoder with .layers, .embed_tokens, .rotary_emb
    attn = base.layers[0].self_attn
    n_q, n_kv = lm.config.num_attention_heads, lm.config.num_key_value_heads
    d_h = getattr(attn, "head_dim", lm.config.hidden_size // n_q)
    B, S = x.shape[:2]  # noqa: N806 (the chapter's names)
    pos = torch.arange(start, start + S, device=x.device)[None].expand(B, -1)
    cos, sin = base.rotary_emb(x, pos)  # [B, S, d_h]
    q = attn.q_proj(x).view(B, S, n_q, d_h).transpose(1, 2)  # [B, n_q, S, d_h]
    k = attn.k_proj(x).view(B, S, n_kv, d_h).transpose(1, 2)  # [B, n_kv, S, d_h]
    v = attn.v_proj(x).view(B, S, n_kv, d_h).transpose(1, 2)
    return _rope(q, cos, sin), _rope(k, cos, sin), v


def chapter_check(lm: LoadedModel) -> ChapterCheck:
    """Run the chapter's code on layer 0 of ``lm`` (see the module docstring), decoding with and without
    ``causal=True``."""
    n_q, n_kv = lm.config.num_attention_heads, lm.config.num_key_value_heads
    ids = torch.tensor(
        [lm.tokenizer(s, add_special_tokens=False)["input_ids"][:TOTAL] for s in SENTENCES], device=lm.device
    )

    def attend(q, k, v, causal: bool):
        rep = n_q // n_kv  # expand KV heads for GQA
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def cached(causal_decode: bool) -> tuple[torch.Tensor, KVCache]:
        cache = KVCache()
        q, k, v = project(lm, x[:, :PROMPT], 0)  # prefill: 8 prompt tokens at once
        k_all, v_all = cache.append(k, v)
        outs = [attend(q, k_all, v_all, causal=True)]
        for t in range(PROMPT, TOTAL):  # decode: one token per step
            q, k, v = project(lm, x[:, t : t + 1], t)  # [B, heads, 1, d_h]
            k_all, v_all = cache.append(k, v)  # cache grows to t+1
            outs.append(attend(q, k_all, v_all, causal=causal_decode))
        return torch.cat(outs, dim=2), cache

    with torch.inference_mode():
        x = layer0_input(lm, ids)  # [B, 12, d_model]
        good, cache = cached(False)
        bad, _ = cached(True)
        q, k, v = project(lm, x, 0)  # reference: full recompute
        full = attend(q, k, v, causal=True)
    if cache.k is None:
        raise RuntimeError("The chapter's cache stayed empty.")
    return ChapterCheck(
        tuple(cache.k.shape), (good - full).abs().max().item(), (bad - full).abs().max().item(), n_q, n_kv
    )


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The model's rotary embedding on [B, H, S, d_h] (the Llama layout: halves rotated)."""
    half = x.shape[-1] // 2
    turned = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None] + turned * sin[:, None]
