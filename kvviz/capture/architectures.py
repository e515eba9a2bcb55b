"""Tiny random-weight models of each cache architecture, run live to show what transformers really stores.

The configs ship with kvviz (``kvviz/memory/presets/tiny_architectures.json``: MHA, GQA, MQA, MLA, sliding,
hybrid, learned-sink, and the caches of 2025–26 models: cross-layer KV sharing (Gemma-4), DeepSeek sparse
attention's indexer keys (DeepSeek-V3.2) and a linear-attention hybrid (Qwen3-Next's gated DeltaNet));
weights are random, nothing is downloaded, and a byte-level tokenizer (UTF-8 bytes = token ids,
vocabulary 256) stands in for a real one. ``run_kind`` captures a short generation with kvviz's own
capture (attention recorded on every layer that attends: a linear-attention hybrid's full-attention
layers; its gated-DeltaNet layers have none and are marked absent, NaN) and reads the cache's tensors, layer by layer and step by step, next to the
memory calculator's formula::

    from kvviz.capture.architectures import run_kind
    live = run_kind("MLA")
    live.measured_bytes == live.formula_bytes, live.tensors[0].shape   # True, (1, 1, 20, 32): the latent
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
import torch

from kvviz.capture.cache_tensors import CacheTensor, bytes_per_layer, stored_tensors
from kvviz.capture.trace import Trace
from kvviz.memory.layout import PRESET_DIR
from kvviz.models import LoadedModel

KINDS_FILE = PRESET_DIR / "tiny_architectures.json"  # beside the other configs (package data of kvviz.memory)
DEFAULT_PROMPT = "The KV cache"
MAX_PROMPT_BYTES = 200  # the tiny models' positions and a second's work


class ByteTokenizer:
    """Text ↔ UTF-8 bytes, one byte per token (the tiny models' vocabulary is 256). No chat template,
    no end token: random weights would never mean one."""

    chat_template = None
    eos_token_id = None

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": list(text.encode("utf-8"))}

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return bytes(int(i) % 256 for i in ids).decode("utf-8", errors="replace")

    def get_vocab(self) -> dict:
        return {}


@cache
def _kinds() -> dict:
    return json.loads(KINDS_FILE.read_text())


def kinds() -> list[str]:
    """The architecture kinds, in the order the page lists them."""
    return list(_kinds())


def describe(kind: str) -> str:
    """One line saying what the kind's cache holds."""
    return _kinds()[check_kind(kind)]["label"]


def check_kind(kind: str) -> str:
    if kind not in _kinds():
        raise ValueError(f"Unknown architecture {kind!r}; choose one of {', '.join(kinds())}.")
    return kind


def tiny_config(kind: str) -> dict:
    """The shipped config dict of ``kind`` (a copy, with ``model_type``)."""
    return json.loads(json.dumps(_kinds()[check_kind(kind)]["config"]))


def build(
    config: dict,
    name: str | None = None,
    seed: int = 0,
    attn_implementation: str | None = None,
    state_layers: bool = False,
) -> LoadedModel:
    """A random-weight fp32 CPU model from a config dict (``model_type`` plus the config's fields).

    The implementation is transformers' default for the class (SDPA where it has one), or eager for
    attention that bypasses transformers' attention interface, the only path kvviz can capture there.
    ``state_layers=True`` lets linear-attention layers through the capture check (a hybrid's attention is
    recorded on its attention layers only).
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    from kvviz.adapters.transformers import force_attn_implementation
    from kvviz.models import check_capturable, uses_interface

    fields = dict(config)
    model_type = fields.pop("model_type")
    cfg = AutoConfig.for_model(model_type, **fields)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation=attn_implementation)
    if not uses_interface(model):
        force_attn_implementation(model.config, "eager")
    model.eval().requires_grad_(False)
    check_capturable(model, state_layers=state_layers)
    return LoadedModel(
        model=model,
        tokenizer=ByteTokenizer(),
        name=name or f"tiny-{model_type}",
        device=torch.device("cpu"),
        dtype=torch.float32,
        stop_ids=set(),
    )


@cache
def tiny_model(kind: str) -> LoadedModel:
    """The tiny model of ``kind``, built once per process and shared read-only."""
    cfg = tiny_config(kind)
    return build(cfg, name=f"tiny {kind} ({cfg['model_type']})", state_layers=_kinds()[kind].get("state_layers", False))


@dataclass(frozen=True)
class StepBytes:
    """One step of the run: tokens seen, and per layer the bytes measured from the cache and the formula's."""

    tokens_seen: int
    layer_bytes: tuple[int, ...]  # keys, values (or latent) and indexer keys: what grows with the tokens
    formula_layer_bytes: tuple[int, ...]
    state_bytes: tuple[int, ...]  # linear-attention layers' conv + recurrent states: fixed size
    formula_state_bytes: tuple[int, ...]

    @property
    def agrees(self) -> bool:
        return self.layer_bytes == self.formula_layer_bytes and self.state_bytes == self.formula_state_bytes


@dataclass(frozen=True)
class LiveCache:
    """A tiny model's real cache after a short run, next to the formula (all sizes in bytes)."""

    kind: str
    model_type: str
    attention: str  # "MHA", "GQA", "MQA", "MLA"
    tokens_seen: int
    text: str
    tensors: tuple[CacheTensor, ...]
    tokens_held: tuple[int, ...]  # per layer (a sliding layer keeps window - 1 between steps)
    layer_bytes: tuple[int, ...]  # measured from the tensors (K/V, latent, indexer keys)
    formula_layer_bytes: tuple[int, ...]  # the memory calculator for the same config and tokens
    kv_sources: tuple[int | None, ...]  # per layer, the earlier layer whose K/V it reads (cross-layer sharing)
    steps: tuple[StepBytes, ...]  # after the prefill and after every decode step
    bytes_per_token: int  # every layer, no window: measured bytes / tokens held, summed over layers
    formula_bytes_per_token: int
    formula: str  # the per-token arithmetic, one term per group of layers that grows with the tokens
    per_head_bytes_per_token: int  # heads × (key dim + value dim): what attention sees, what MLA avoids caching
    max_abs_logit_diff_vs_unpatched: float | None  # None where the check did not run
    elapsed_s: float
    learned_sink_share: float | None = None  # mean share of attention the learned sinks took (no cache entry holds it)
    index_topk: int | None = None  # DeepSeek sparse attention: keys each query attends to
    trace: Trace | None = None  # the capture's record: attention summaries, NaN on layers without attention
    fixed_formula: str = ""  # the fixed states' arithmetic (linear-attention layers), "" without any

    @property
    def attention_layers(self) -> tuple[int, ...]:
        """The layers whose attention the run recorded (read from the trace: those with rows that are not NaN)."""
        rows = None if self.trace is None else self.trace.window_rows
        return () if rows is None else tuple(i for i in range(rows.shape[0]) if not np.isnan(rows[i]).all())

    @property
    def state_bytes(self) -> tuple[int, ...]:
        return self.steps[-1].state_bytes

    @property
    def formula_state_bytes(self) -> tuple[int, ...]:
        return self.steps[-1].formula_state_bytes

    @property
    def measured_bytes(self) -> int:
        return sum(self.layer_bytes)

    @property
    def formula_bytes(self) -> int:
        return sum(self.formula_layer_bytes)

    @property
    def cache_bytes(self) -> int:
        """Everything the cache holds: what grows with the tokens plus the fixed states."""
        return self.measured_bytes + sum(self.state_bytes)

    @property
    def formula_cache_bytes(self) -> int:
        return self.formula_bytes + sum(self.formula_state_bytes)

    @property
    def growing_layers(self) -> tuple[int, ...]:
        """The layers whose cache grew at the run's last step (a sliding layer at its window, a fixed state
        and a KV-sharing layer do not); with a single step, the layers that hold K/V at all."""
        if len(self.steps) < 2:
            return tuple(i for i, b in enumerate(self.layer_bytes) if b)
        before, last = self.steps[-2], self.steps[-1]
        return tuple(i for i, (a, b) in enumerate(zip(before.layer_bytes, last.layer_bytes)) if b > a)

    @property
    def label(self) -> str:
        return describe(self.kind)

    @property
    def agrees(self) -> bool:
        """Measured bytes equal the formula's, layer by layer, at every step (and per token)."""
        return all(s.agrees for s in self.steps) and self.bytes_per_token == self.formula_bytes_per_token


def _term(group) -> str:
    """One group of layers in the per-token formula: ``2 sliding layers × 2 × 2 KV heads × 16 × 4 B``."""
    kind = "MLA" if group.kind == "mla" else group.kind
    return f"{group.count} {kind} layer{'s' if group.count > 1 else ''} × {group.per_token_expr}"


def _fixed_term(layout, dtype_bytes: int) -> str:
    """The fixed states in the formula: ``3 state layers × 512 elements × 4 B`` (one term per state size)."""
    sizes: dict[int, int] = {}
    for spec in layout.layers:
        if spec.state_elements:
            sizes[spec.state_elements] = sizes.get(spec.state_elements, 0) + 1
    return " + ".join(
        f"{n} state layer{'s' if n > 1 else ''} × {elements:,} elements × {dtype_bytes} B"
        for elements, n in sizes.items()
    )


def run_kind(kind: str, prompt: str = DEFAULT_PROMPT, max_new_tokens: int = 8) -> LiveCache:
    """Capture ``prompt`` + ``max_new_tokens`` on the tiny model of ``kind`` and read its cache."""
    from transformers import DynamicCache

    from kvviz.capture.loop import capture
    from kvviz.memory.estimate import estimate, layer_groups, live_cache_bytes_formula
    from kvviz.memory.layout import cache_layout

    check_kind(kind)
    data = (prompt or "").encode("utf-8")
    if not data:
        raise ValueError("The prompt is empty: type a few words.")
    if len(data) > MAX_PROMPT_BYTES:
        raise ValueError(f"The prompt is {len(data)} bytes; the tiny models take at most {MAX_PROMPT_BYTES}.")
    if not 1 <= max_new_tokens <= 64:
        raise ValueError("max_new_tokens must be from 1 to 64.")
    lm = tiny_model(kind)
    layout = cache_layout(lm.config)
    caches: list = []
    measured_steps: list[tuple[CacheTensor, ...]] = []

    def keep_cache(model: LoadedModel):
        caches.append(DynamicCache(config=model.config))
        return caches[-1]

    def measure(cache, recorder, step):  # after the prefill and after every decode step, from the tensors
        measured_steps.append(stored_tensors(cache, layout))

    run: dict[str, Any] = dict(chat=False, max_new_tokens=max_new_tokens, cache_factory=keep_cache, after_step=measure)
    t0 = time.perf_counter()
    trace = capture(lm, prompt, verify=True, **run)  # a linear layer runs as loaded, recording nothing
    elapsed = time.perf_counter() - t0
    n = layout.num_layers
    steps = []
    for step, tensors_then in zip(trace.steps, measured_steps):
        f = live_cache_bytes_formula(layout, step.position, 4)
        steps.append(
            StepBytes(
                step.position,
                bytes_per_layer(tensors_then, n, "kv"),
                tuple(f["layer_bytes"]),
                bytes_per_layer(tensors_then, n, "state"),
                tuple(f["state_bytes"]),
            )
        )
    tensors = stored_tensors(caches[0], layout)
    held = tuple(
        next((int(t.shape[-2]) for t in tensors if t.layer == i and t.name in ("keys", "latent")), 0) for i in range(n)
    )
    measured = bytes_per_layer(tensors, n, "kv")
    seen = trace.n_fed
    formula = live_cache_bytes_formula(layout, seen, 4)
    est = estimate(layout, seen, kv_dtype="fp32")
    if layout.mla:  # attention expands the latent to every head's key (nope + rope) and value
        per_head = layout.num_attention_heads * (layout.head_dim + layout.mla["v_head_dim"])
    else:
        per_head = 2 * layout.num_key_value_heads * layout.head_dim
    return LiveCache(
        kind=kind,
        model_type=layout.model_type,
        attention=layout.attention,
        tokens_seen=seen,
        text=trace.text,
        tensors=tensors,
        tokens_held=held,
        layer_bytes=measured,
        formula_layer_bytes=tuple(formula["layer_bytes"]),
        kv_sources=tuple(spec.kv_source for spec in layout.layers),
        steps=tuple(steps),
        bytes_per_token=sum(b // h for b, h in zip(measured, held) if h),
        formula_bytes_per_token=est.bytes_per_token,
        formula=" + ".join(_term(g) for g in layer_groups(layout, est) if g.kind != "state"),
        per_head_bytes_per_token=per_head * 4 * n,
        max_abs_logit_diff_vs_unpatched=(trace.equivalence or {}).get("max_abs_logit_diff_vs_unpatched"),
        elapsed_s=elapsed,
        learned_sink_share=None if trace.learned_sink_mass is None else float(trace.learned_sink_mass.mean()),
        index_topk=getattr(lm.config, "index_topk", None),
        trace=trace,
        fixed_formula=_fixed_term(layout, 4),
    )
