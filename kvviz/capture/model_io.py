"""What one forward and one new token need: the model's shape, the prompt's ids, the cache's bytes,
one forward at absolute positions, and the sampling rule.

Every run in kvviz — a solo capture, a batch of the lecture hall's requests, an eviction or a
quantization run — goes through :func:`forward` (or its packed form, :mod:`kvviz.capture.packed`)
and chooses tokens with :func:`sample`.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import numpy as np
import torch

from kvviz.capture.attention_fn import is_installed, recording
from kvviz.capture.recorder import RecordsAttention
from kvviz.capture.trace import ModelInfo
from kvviz.models import LoadedModel, attention_modules

DISPLAY_BUDGET_BYTES = 48 * 2**20  # fp16 binned map + decode rows may use this much (or a quarter of the KV bytes)
# prompt tokens per prefill forward: a long prompt reports progress between chunks and never holds
# activations for more than this many tokens at once; each chunk attends to the cache the ones before it left
PREFILL_CHUNK = 1024


@dataclass(frozen=True)
class Progress:
    """Where a run is between two yielded steps: ``phase`` "prefill" (``done`` of ``total`` prompt tokens
    are in the cache) or "verify" (recomputing without the cache; ``done`` of ``total`` reference runs)."""

    phase: str
    done: int
    total: int


@dataclass
class Sampling:
    """Greedy when ``temperature`` is 0; otherwise temperature + nucleus (top-p) sampling."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0

    def validate(self) -> None:
        if not (0.0 <= self.temperature <= 5.0) or not np.isfinite(self.temperature):
            raise ValueError("temperature must be between 0 and 5 (0 = greedy).")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError("top_p must be in (0, 1].")


def model_info(lm: LoadedModel) -> ModelInfo:
    """The model's shape, every config number read by :func:`kvviz.memory.layout.cache_layout` (the one reader);
    the rest (dtype, parameters, learned sinks) measured on the loaded model."""
    layout, sinks, param_count, weight_bytes = _measured(lm)
    cache_heads, cache_dims = layout.num_key_value_heads, [layout.head_dim, layout.head_dim]
    if layout.mla:  # attention sees per-head keys and values; the cache holds one latent + one RoPE key
        cache_heads, cache_dims = 1, [layout.mla["kv_lora_rank"], layout.mla["qk_rope_head_dim"]]
    attending = [s.index for s in layout.layers if s.kind not in ("state", "none")]  # a linear layer has no attention
    return ModelInfo(
        name=lm.name,
        model_type=layout.model_type,
        layers=layout.num_layers,
        q_heads=layout.num_attention_heads,
        kv_heads=layout.num_key_value_heads,
        head_dim=layout.head_dim,
        dtype=str(lm.dtype).removeprefix("torch."),
        bytes_per_element=torch.tensor([], dtype=lm.dtype).element_size(),
        layer_kinds=["full_attention" if spec.layer_type == "mla" else spec.layer_type for spec in layout.layers],
        sliding_window=min(layout.windows) if layout.windows else None,
        context_length=layout.max_position_embeddings or 0,
        param_count=param_count,
        weight_bytes=weight_bytes,
        device=str(lm.device),
        attention=layout.attention,
        cache_heads=cache_heads,
        cache_dims=cache_dims,
        learned_sinks=sinks,
        attention_layers=attending if len(attending) < layout.num_layers else None,
    )


def _measured(lm: LoadedModel) -> tuple:
    """The model's cache layout, whether it has learned sinks, its parameter count and bytes: read once per
    model, config, dtype and device and kept on the model (every Generation asks — a room's 24 requests
    each walked the modules and parameters, ~4 ms apiece, while the others waited for the interpreter)."""
    from kvviz.memory.layout import cache_layout

    key = (id(lm.config), lm.dtype, str(lm.device))
    memo = lm.model.__dict__.setdefault("_kvviz_measured", {})
    if key not in memo:
        params = list(lm.model.parameters())
        memo[key] = (
            cache_layout(lm.config),
            any(isinstance(getattr(m, "sinks", None), torch.nn.Parameter) for m in attention_modules(lm.model)),
            sum(p.numel() for p in params),
            sum(p.numel() * p.element_size() for p in params),
        )
    return memo[key]


def encode_prompt(lm: LoadedModel, prompt: str, chat: bool) -> list[int]:
    """Token ids of the prompt, through the model's chat template when ``chat``."""
    tok = lm.tokenizer
    if chat and getattr(tok, "chat_template", None):
        ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        return [int(i) for i in ids]
    return [int(i) for i in tok(prompt, add_special_tokens=True)["input_ids"]]


def cache_layer_bytes(cache) -> tuple[list[int], list[int]]:
    """Per layer: entries held and bytes of the stored key and value tensors, and of a sparse-attention
    indexer's keys where the layer keeps them (not a formula). A layer that says what it holds (``kv_held()``:
    the engine's slots, :class:`~kvviz.engine.slots.SlotLayer`) is asked instead of viewing its tensors."""
    lens, sizes = [], []
    for layer in cache.layers:
        held = getattr(layer, "kv_held", None)
        if held is not None:
            n, size = held()
            lens.append(n)
            sizes.append(size)
            continue
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if keys is None or values is None or keys.numel() == 0:
            lens.append(0)
            sizes.append(0)
            continue
        index = getattr(layer, "indexer_keys", None)  # DeepSeek sparse attention's indexer key per token
        lens.append(int(keys.shape[-2]))
        sizes.append(
            int(keys.numel() * keys.element_size() + values.numel() * values.element_size())
            + (int(index.numel() * index.element_size()) if isinstance(index, torch.Tensor) else 0)
        )
    return lens, sizes


def choose_bin_factor(info: ModelInfo, n_prompt: int, t_max: int, budget: int | None = None) -> int:
    """Smallest bin size whose binned map and decode rows (fp16 in the trace) fit the display budget.

    The budget is the larger of a fixed floor (short runs stay exact, f = 1, up to ~300 tokens in all on
    SmolLM2) and a quarter of the final KV cache, so that with the exact summaries (column sums,
    window rows) a trace stays within 2× the cache it describes at long contexts.
    """
    budget = budget or max(DISPLAY_BUDGET_BYTES, info.kv_bytes_per_token * t_max // 4)
    heads = info.layers * info.q_heads
    f = 1
    while True:
        nb, nqb = -(-t_max // f), -(-n_prompt // f)
        if heads * 2 * (nqb + t_max - n_prompt) * nb <= budget or nb <= 16:
            return f
        f += 1


def cache_kwarg(model) -> str:
    """The name the model's forward takes its cache under (``cache`` in newer transformers)."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def sample(logits: torch.Tensor, sampling: Sampling, gen: torch.Generator) -> int:
    """The next token: the argmax when greedy, else a draw from the tempered, top-p-truncated distribution."""
    if sampling.temperature <= 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.float() / sampling.temperature, dim=-1)
    if sampling.top_p < 1.0:
        sorted_p, idx = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_p, 0) - sorted_p < sampling.top_p
        keep[0] = True  # the most likely token always (a top_p that rounds to 0 in float32 would keep none)
        probs = torch.zeros_like(probs).scatter_(0, idx[keep], sorted_p[keep])
    return int(torch.multinomial(probs.cpu(), 1, generator=gen))


def forward(
    lm: LoadedModel, ids: list[int], start: int, cache, recorder: RecordsAttention | None, logits_to_keep: int = 1
) -> torch.Tensor:
    """One forward of ``ids`` at absolute positions ``start…``; returns logits [q, vocab] (fp32)."""
    x = torch.tensor([ids], device=lm.device)
    pos = torch.arange(start, start + len(ids), device=lm.device)[None]
    kw = {cache_kwarg(lm.model): cache}
    own = cache.forward_kwargs() if hasattr(cache, "forward_kwargs") else {}  # e.g. a ragged cache's attention
    if own and not is_installed(lm.model):
        raise RuntimeError("This cache needs kvviz's attention wrapper installed (capture.recorder.installed).")
    keep = logits_to_keep
    if recorder is not None and keep and len(ids) > 1 and _shares_kv(lm.model):
        keep = 0  # Gemma-3n / 4 run their KV-shared layers on the kept rows only; the recorder needs every row
    with recording(lm.model, recorder) as extra:
        out = lm.model(input_ids=x, position_ids=pos, use_cache=True, logits_to_keep=keep, **kw, **extra, **own)
    if recorder is not None:
        recorder.end_forward()
    return (out.logits[0] if keep == logits_to_keep else out.logits[0, -logits_to_keep:]).float()


def _shares_kv(model) -> bool:
    """Whether some layers attend to an earlier layer's K/V (the config's ``kv_sharing_modes`` says "reuse")."""
    config = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") else model.config
    return "reuse" in (getattr(config, "kv_sharing_modes", None) or ())
