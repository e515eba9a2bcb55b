"""The Trace: the one record of a generation run that every view, policy and export reads.

A Trace holds plain data only (token ids and texts, per-step cache lengths and bytes, attention
summaries as numpy arrays), so figures can be pure functions of it and it round-trips through one
``.npz`` file. Array shapes use ``Lyr`` = layers, ``Hq`` = query heads, ``Hkv`` = KV heads,
``L`` = prompt tokens, ``T`` = all tokens, ``nb`` = display bins of ``bin_factor`` positions.
"""

from __future__ import annotations

import io
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

# largest |Δ logit| between cached decoding and full recomputation that is fp32 rounding; the floor of every dtype's
# tolerance (kvviz.capture.tolerance derives the others from their precision)
EQUIVALENCE_TOLERANCE = 1e-3

FORMAT_VERSION = 1
_ARRAYS = (
    "prefill_colsum",
    "colsum",
    "sink_mass",
    "window_rows",
    "prefill_map",
    "decode_rows",
    "key_norms",
    "value_norms",
    "key_channel_absmean",
    "value_channel_absmean",
    "learned_sink_mass",
)


@dataclass
class ModelInfo:
    """The attention shape of the model, as its config states it."""

    name: str
    model_type: str
    layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    dtype: str
    bytes_per_element: int
    layer_kinds: list[str]
    sliding_window: int | None
    context_length: int
    param_count: int
    weight_bytes: int
    device: str
    attention: str = ""  # "MHA", "GQA", "MQA" or "MLA"
    # what each layer's cache stores per token: heads × (key-side dim, value-side dim). Attention layers:
    # kv_heads × (head_dim, head_dim); MLA: 1 × (latent, RoPE key), whatever heads attention expands them to
    cache_heads: int | None = None
    cache_dims: list[int] | None = None
    learned_sinks: bool = False  # each head has a learned sink logit (gpt-oss)
    # the layers that attend, where some do not (a linear-attention hybrid's full-attention layers); None:
    # every layer. The others' attention summaries are NaN: absent, not zero attention
    attention_layers: list[int] | None = None

    @property
    def group_size(self) -> int:
        """Query heads per KV head (GQA group); 1 for MHA, ``q_heads`` for MQA."""
        return self.q_heads // self.kv_heads

    @property
    def stored_heads(self) -> int:
        return self.cache_heads or self.kv_heads

    @property
    def stored_dims(self) -> tuple[int, int]:
        """Per head: elements of the stored key-side and value-side vectors (MLA: latent and RoPE key)."""
        return (self.cache_dims[0], self.cache_dims[1]) if self.cache_dims else (self.head_dim, self.head_dim)

    @property
    def stored_names(self) -> tuple[str, str]:
        """What the cache's two tensors hold: keys and values, or MLA's latent and RoPE key."""
        return ("latent", "RoPE key") if self.attention == "MLA" else ("key", "value")

    @property
    def kv_bytes_per_token(self) -> int:
        """Layers × stored heads × (key + value dims) × bytes: the chapter's 2 · L · n_kv · d_h · b, and
        L · (d_c + d_rope) · b for MLA (no factor 2, no heads)."""
        return self.layers * self.stored_heads * sum(self.stored_dims) * self.bytes_per_element


@dataclass
class Step:
    """One forward pass: step 0 is the prefill, each later step feeds one generated token."""

    index: int
    token_id: int
    token: str
    position: int
    cache_lens: list[int]
    layer_bytes: list[int]
    elapsed_s: float

    @property
    def cache_bytes(self) -> int:
        return int(sum(self.layer_bytes))


@dataclass
class Trace:
    """Everything kvviz recorded about one run (see the module docstring for shapes)."""

    model: ModelInfo
    prompt: str
    chat: bool
    settings: dict
    token_ids: list[int]
    tokens: list[str]
    n_prompt: int
    steps: list[Step] = field(default_factory=list)
    text: str = ""
    stop_reason: str = ""
    bin_factor: int = 1
    sink_k: int = 4
    timings: dict = field(default_factory=dict)
    equivalence: dict | None = None
    cached_prompt_tokens: int = 0  # leading prompt tokens whose KV (and attention rows) came from a prefix cache
    turn_cached_tokens: int | None = None  # a chat turn: its leading tokens (prompt + answer) a prefix cache kept
    # attention summaries, filled when the run finishes
    prefill_colsum: np.ndarray | None = None  # [Lyr, Hq, L] attention each prompt key got from prompt queries
    colsum: np.ndarray | None = None  # [Lyr, Hq, T] the same, summed over every query of the run
    sink_mass: np.ndarray | None = None  # [Lyr, Hq, Tq] mass each query put on the first sink_k tokens
    window_rows: np.ndarray | None = None  # [Lyr, Hq, W, L] exact rows of the last W prompt queries
    prefill_map: np.ndarray | None = None  # [Lyr, Hq, nqb, nkb] mean row per query bin, mass per key bin
    decode_rows: np.ndarray | None = None  # [S, Lyr, Hq, nb] one binned row per fed decode token
    # the cache's own tensors (MLA: "key" = the latent, "value" = the RoPE key; see ModelInfo.stored_names)
    key_norms: np.ndarray | None = None  # [Lyr, Hkv, T] L2 norm of each cached key (NaN if not held)
    value_norms: np.ndarray | None = None  # [Lyr, Hkv, T]
    key_channel_absmean: np.ndarray | None = None  # [Lyr, Hkv, Dk] mean |k| per channel
    value_channel_absmean: np.ndarray | None = None  # [Lyr, Hkv, Dv]
    learned_sink_mass: np.ndarray | None = None  # [Lyr, Hq, Tq] share each query gave its head's learned sink
    # per prompt token, where its keys and values came from: "computed", "memory" or "disk" (a prefix store's
    # tiers); empty when no prefix store was asked (every token computed)
    prompt_sources: list[str] = field(default_factory=list)

    def recorded(self, name: str) -> np.ndarray:
        """A summary array the finished run filled (``"colsum"``, ``"prefill_map"``, ...); an error before that."""
        value = getattr(self, name)
        if value is None:
            raise ValueError(f"The run has not finished: the trace has no {name} yet.")
        return value

    # ---- derived views -------------------------------------------------------------------
    @property
    def n_generated(self) -> int:
        return len(self.token_ids) - self.n_prompt

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def n_fed(self) -> int:
        """Tokens that went through the model: the prompt plus every generated token but the last."""
        return self.n_prompt + max(self.n_generated - 1, 0)

    @property
    def cache_bytes(self) -> int:
        return self.steps[-1].cache_bytes if self.steps else 0

    def step_frame(self) -> pd.DataFrame:
        """One row per step: what was produced, how long the cache is, how many bytes it holds."""
        rows = []
        for s in self.steps:
            rows.append(
                {
                    "step": s.index,
                    "phase": "prefill" if s.index == 0 else "decode",
                    "token_id": s.token_id,
                    "token": s.token,
                    "position": s.position,
                    "cache_tokens_max": max(s.cache_lens) if s.cache_lens else 0,
                    "cache_bytes": s.cache_bytes,
                    "elapsed_s": s.elapsed_s,
                }
            )
        return pd.DataFrame(rows)

    def layer_frame(self) -> pd.DataFrame:
        """Long table: step × layer → cache length (tokens) and bytes."""
        rows = [
            {"step": s.index, "layer": i, "cache_tokens": n, "cache_bytes": b}
            for s in self.steps
            for i, (n, b) in enumerate(zip(s.cache_lens, s.layer_bytes))
        ]
        return pd.DataFrame(rows)

    def token_frame(self) -> pd.DataFrame:
        """One row per token: position, text, prompt or generated, attention received (layer/head mean)."""
        received = self.colsum.mean(axis=(0, 1)) if self.colsum is not None else None
        return pd.DataFrame(
            {
                "position": range(self.n_tokens),
                "token_id": self.token_ids,
                "token": self.tokens,
                "source": ["prompt"] * self.n_prompt + ["generated"] * self.n_generated,
                "attention_received": received if received is not None else np.nan,
            }
        )

    def source_counts(self) -> dict[str, int]:
        """Prompt tokens per source: computed, from the prefix store's memory, from its disk tier."""
        sources = self.prompt_sources or ["computed"] * self.n_prompt
        return {k: sources.count(k) for k in ("computed", "memory", "disk")}

    def usage(self) -> dict:
        """Token counts in OpenAI's ``usage`` form: ``prompt_tokens_details.cached_tokens`` is the prompt
        tokens not computed, split by tier (``memory_tokens``, ``disk_tokens``)."""
        counts = self.source_counts()
        return {
            "prompt_tokens": self.n_prompt,
            "completion_tokens": self.n_generated,
            "total_tokens": self.n_tokens,
            "prompt_tokens_details": {
                "cached_tokens": self.cached_prompt_tokens,
                "memory_tokens": counts["memory"],
                "disk_tokens": counts["disk"],
                "computed_tokens": counts["computed"],
            },
        }

    def summary(self) -> dict:
        """JSON-able summary (the CLI's and the API's answer)."""
        m = self.model
        out = {
            "model": {
                "name": m.name,
                "layers": m.layers,
                "q_heads": m.q_heads,
                "kv_heads": m.kv_heads,
                "head_dim": m.head_dim,
                "dtype": m.dtype,
                "bytes_per_element": m.bytes_per_element,
                "layer_kinds": m.layer_kinds,
                "sliding_window": m.sliding_window,
                "attention": m.attention,
                "learned_sinks": m.learned_sinks,
            },
            "prompt_tokens": self.n_prompt,
            "generated_tokens": self.n_generated,
            "text": self.text,
            "stop_reason": self.stop_reason,
            "steps": [
                {
                    "step": s.index,
                    "token": s.token,
                    "token_id": s.token_id,
                    "position": s.position,
                    "cache_lens": s.cache_lens,
                    "cache_bytes": s.cache_bytes,
                }
                for s in self.steps
            ],
            "cache_bytes": self.cache_bytes,
            "cached_prompt_tokens": self.cached_prompt_tokens,
            "usage": self.usage(),
            "kv_bytes_per_token": m.kv_bytes_per_token,
            "timings": self.timings,
        }
        if self.turn_cached_tokens is not None:
            out["turn_cached_tokens"] = self.turn_cached_tokens
        if self.equivalence is not None:
            out["max_abs_logit_diff_vs_recompute"] = self.equivalence.get("max_abs_logit_diff")
            out["max_abs_attn_output_diff_vs_recompute"] = self.equivalence.get("max_abs_attn_output_diff")
            out["max_abs_logit_diff_vs_unpatched"] = self.equivalence.get("max_abs_logit_diff_vs_unpatched")
            out["equivalence"] = self.verdict()
        return out

    def verdict(self) -> dict:
        """The equivalence check in a few fields: whether the cache changed nothing, judged by the tolerance of
        the dtype the run computed in (runs recorded before it was stored: fp32's), and the greedy tokens'
        and top-k ranking's agreement. Empty when the run was not checked."""
        eq = self.equivalence
        if not eq:
            return {}
        tol = eq.get("tolerance", EQUIVALENCE_TOLERANCE)
        return {
            "cache_changes_nothing": bool(eq["max_abs_logit_diff"] < tol),
            "dtype": eq.get("dtype", self.model.dtype),
            "tolerance": tol,
            "positions_checked": eq.get("positions_checked"),
            "greedy_tokens_agree": eq.get("top1_agree"),
            "top_k": eq.get("top_k"),
            "top_k_ranking_agrees": eq.get("topk_agree"),
            "near_ties": eq.get("near_ties"),
        }

    def nbytes(self) -> int:
        """Bytes the trace's arrays hold (the capture-memory benchmark's measure)."""
        return int(sum(getattr(self, n).nbytes for n in _ARRAYS if getattr(self, n) is not None))

    # ---- persistence ---------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write the trace to one ``.npz`` file (metadata as JSON inside; no pickles)."""
        path = Path(path)
        meta = asdict(self)
        for name in _ARRAYS:
            meta.pop(name)
        meta["format_version"] = FORMAT_VERSION
        arrays = {n: getattr(self, n) for n in _ARRAYS if getattr(self, n) is not None}
        with open(path, "wb") as fh:
            np.savez_compressed(fh, __meta__=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **arrays)
        return path

    @classmethod
    def load(cls, path: str | Path | bytes) -> Trace:
        """Read a file written by :meth:`save`; refuses anything else with a ValueError."""
        source = io.BytesIO(path) if isinstance(path, bytes) else path
        try:
            with np.load(source, allow_pickle=False) as data:
                meta = json.loads(bytes(data["__meta__"]).decode())
                arrays = {n: data[n] for n in _ARRAYS if n in data.files}
        except (OSError, KeyError, ValueError, json.JSONDecodeError) as exc:
            raise ValueError(f"Not a kvviz trace file: {exc}") from exc
        if meta.pop("format_version", None) != FORMAT_VERSION:
            raise ValueError("Trace file was written by an incompatible kvviz version.")
        meta["model"] = ModelInfo(**meta["model"])
        meta["steps"] = [Step(**s) for s in meta["steps"]]
        return cls(**meta, **arrays)
