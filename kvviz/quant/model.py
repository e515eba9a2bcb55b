"""The real model's queries, keys and values after a prefill, and every quantization scheme scored on them.

::

    from kvviz.models import load_model
    from kvviz.quant.schemes import preset_schemes
    from kvviz.quant.model import collect_qkv, compare
    qkv = collect_qkv(load_model(), "Once upon a time, in a small village by the sea,")
    compare(qkv, preset_schemes())          # DataFrame: K/V/attention-output error and bytes per scheme

Queries are taken where attention sees them (after RoPE) by handing the capture attention function
(:mod:`kvviz.capture.recorder`) a tiny collector instead of a Recorder; keys and values are read from the
transformers cache the prefill filled, i.e. exactly what a KV cache stores.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from transformers import DynamicCache

from kvviz.capture.attention_fn import installed
from kvviz.capture.model_io import encode_prompt, forward
from kvviz.capture.tokens import token_texts
from kvviz.models import LoadedModel
from kvviz.quant.schemes import (
    FULL_BYTES,
    Scheme,
    attention_output,
    quantized_prefix,
    rotated,
    simulate,
    stored_bytes,
)
from kvviz.units import format_bytes


@dataclass
class QKV:
    """One prefill's attention inputs: q [Lyr, Hq, T, D], k and v [Lyr, Hkv, T, D] (fp32, post-RoPE)."""

    tokens: list[str]
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    scaling: float
    model_outputs: torch.Tensor | None = None  # [Lyr, T, Hq*D] the model's own attention outputs, if kept
    _exact: list[torch.Tensor] | None = None

    def exact_output(self, layer: int) -> torch.Tensor:
        """Attention output with the unquantized cache, [Hq, T, D] (computed once per layer)."""
        if self._exact is None:
            self._exact = [attention_output(self.q[i], self.k[i], self.v[i], self.scaling) for i in range(self.layers)]
        return self._exact[layer]

    @property
    def layers(self) -> int:
        return self.k.shape[0]

    @property
    def kv_heads(self) -> int:
        return self.k.shape[1]

    @property
    def n_tokens(self) -> int:
        return self.k.shape[2]

    @property
    def head_dim(self) -> int:
        return self.k.shape[3]

    def crop(self, n_tokens: int) -> QKV:
        """The first ``n_tokens`` positions (causal: the same numbers a shorter prompt gives)."""
        return QKV(
            self.tokens[:n_tokens],
            self.q[:, :, :n_tokens],
            self.k[:, :, :n_tokens],
            self.v[:, :, :n_tokens],
            self.scaling,
        )


class _QueryCollector:
    """Stands in for :class:`kvviz.capture.recorder.Recorder`: keeps each layer's query, nothing else."""

    def __init__(self, layers: int, keep_outputs: bool = False):
        self.queries: list[torch.Tensor | None] = [None] * layers
        self.outputs: list[torch.Tensor | None] = [None] * layers
        self.keep_outputs = keep_outputs
        self.scaling: float | None = None

    def record(self, layer, query, key, mask, scaling, softcap, out, **extra) -> None:
        self.queries[layer] = query[0].float().clone()  # [Hq, T, D]
        self.scaling = scaling
        if self.keep_outputs:
            self.outputs[layer] = out[0].reshape(out.shape[1], -1).float().clone()  # [T, Hq*D]

    def record_weights(self, layer, weights, learned_sinks: bool = False) -> None:
        pass  # legacy attention hands over probabilities only; collect_qkv then refuses (no queries)

    def end_forward(self) -> None:
        pass


def collect_qkv(
    lm: LoadedModel,
    prompt: str | None = None,
    chat: bool = False,
    ids: list[int] | None = None,
    keep_outputs: bool = False,
) -> QKV:
    """Run one prefill of the prompt and return every layer's Q, K, V (and the model's outputs if asked)."""
    ids = list(ids) if ids is not None else encode_prompt(lm, prompt or "", chat)
    if len(ids) < 2:
        raise ValueError("The prompt needs at least 2 tokens to show keys and values.")
    cache = DynamicCache(config=lm.config)
    collector = _QueryCollector(len(cache.layers) or lm.config.num_hidden_layers, keep_outputs)
    with torch.inference_mode(), installed(lm.model):
        forward(lm, ids, 0, cache, collector)
    stored = [(getattr(layer, "keys", None), getattr(layer, "values", None)) for layer in cache.layers]
    kv = [(keys, values) for keys, values in stored if keys is not None and values is not None]
    if len(kv) != len(stored) or {keys.shape[-2] for keys, _ in kv} != {len(ids)}:
        raise ValueError(
            "This model has sliding-window layers whose cache drops tokens; the quantization "
            "view needs every layer to hold the whole prompt (shorten the prompt)."
        )
    k = torch.stack([keys[0] for keys, _ in kv]).float()  # [Lyr, Hkv, T, D]
    v = torch.stack([values[0] for _, values in kv]).float()
    queries = [q for q in collector.queries if q is not None]
    if len(queries) != len(collector.queries) or collector.scaling is None:
        raise ValueError(
            "This model's attention bypasses transformers' attention interface, so its queries "
            "cannot be read for the quantization view."
        )
    q = torch.stack(queries)  # [Lyr, Hq, T, D]
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            "This model caches MLA's latent and RoPE key, not per-head keys and values; the "
            "quantization view needs per-head keys."
        )
    tok = lm.tokenizer
    outputs = torch.stack([o for o in collector.outputs if o is not None]) if keep_outputs else None
    return QKV(token_texts(tok, ids), q, k, v, float(collector.scaling), outputs)


# ---- scoring a scheme ----------------------------------------------------------------------------
@dataclass
class SchemeResult:
    """Errors are relative Frobenius norms (fractions); bytes are for the whole cache of this prompt."""

    scheme: Scheme
    key_error: float
    value_error: float
    output_error: float
    key_bytes: int
    value_bytes: int
    baseline_bytes: int  # the same cache in 16-bit
    layer_key_error: list[float]
    layer_value_error: list[float]
    layer_output_error: list[float]
    n_tokens: int = 0
    key_quantized: int = 0  # tokens stored quantized (the rest wait in full precision)
    value_quantized: int = 0

    @property
    def total_bytes(self) -> int:
        return self.key_bytes + self.value_bytes

    @property
    def compression(self) -> float:
        return self.baseline_bytes / self.total_bytes if self.total_bytes else float("inf")


def _pooled(errs: list[tuple[float, float]]) -> float:
    """Relative error over all layers from per-layer (squared error, squared norm) pairs."""
    num, den = sum(e for e, _ in errs), sum(n for _, n in errs)
    return float(np.sqrt(num / den)) if den else 0.0


def evaluate(qkv: QKV, scheme: Scheme) -> SchemeResult:
    """Quantize every layer's K and V under ``scheme`` and recompute attention for the same queries."""
    # per layer: (squared error, squared norm of the exact tensor)
    kerr: list[tuple[float, float]] = []
    verr: list[tuple[float, float]] = []
    oerr: list[tuple[float, float]] = []
    with torch.inference_mode():
        for layer in range(qkv.layers):
            k, v = qkv.k[layer], qkv.v[layer]  # [Hkv, T, D]
            k_hat, v_hat = simulate(k, scheme.key), simulate(v, scheme.value)
            exact = qkv.exact_output(layer)  # [Hq, T, D]
            approx = attention_output(qkv.q[layer], k_hat, v_hat, qkv.scaling)
            for store, a, b in ((kerr, k_hat, k), (verr, v_hat, v), (oerr, approx, exact)):
                store.append(((a - b).pow(2).sum().item(), b.pow(2).sum().item()))
    shape = tuple(qkv.k.shape)
    kb = sum(stored_bytes(shape[1:], scheme.key).total for _ in range(qkv.layers))
    vb = sum(stored_bytes(shape[1:], scheme.value).total for _ in range(qkv.layers))

    def per_layer(errs):
        return [float(np.sqrt(e / n)) if n else 0.0 for e, n in errs]

    t = qkv.n_tokens
    return SchemeResult(
        scheme,
        _pooled(kerr),
        _pooled(verr),
        _pooled(oerr),
        kb,
        vb,
        2 * int(np.prod(shape)) * FULL_BYTES,
        per_layer(kerr),
        per_layer(verr),
        per_layer(oerr),
        t,
        quantized_prefix(t, scheme.key),
        quantized_prefix(t, scheme.value),
    )


def compare(qkv: QKV, schemes: list[Scheme], progress=None) -> tuple[pd.DataFrame, list[SchemeResult]]:
    """Score each scheme; returns a table (errors in %, bytes) and the full results."""
    results = []
    for i, scheme in enumerate(schemes):
        if progress is not None:
            progress(i / len(schemes), desc=f"Quantizing: {scheme.name}")
        results.append(evaluate(qkv, scheme))
    return results_frame(results), results


def results_frame(results: list[SchemeResult]) -> pd.DataFrame:
    """One row per scheme; errors in percent, the cache in KiB/MiB, compression vs a 16-bit cache (the errors
    first, beside the scheme's name: they are the point; the spelled-out groupings last)."""
    return pd.DataFrame(
        [
            {
                "scheme": r.scheme.name,
                "K error (%)": round(100 * r.key_error, 3),
                "V error (%)": round(100 * r.value_error, 3),
                "attention output error (%)": round(100 * r.output_error, 3),
                "cache": format_bytes(r.total_bytes),
                "vs 16-bit": f"{r.compression:.2f}× smaller",
                "tokens quantized (K / V)": f"{r.key_quantized} / {r.value_quantized} of {r.n_tokens}",
                "keys": r.scheme.key.label,
                "values": r.scheme.value.label,
            }
            for r in results
        ]
    )


# ---- what the magnitude maps show ----------------------------------------------------------------
def magnitude_map(qkv: QKV, layer: int, head: int, which: str = "k", rotate: bool = False) -> np.ndarray:
    """|K| or |V| of one layer and KV head as channels × tokens: [D, T]; ``rotate``: after the Hadamard turn."""
    check_layer_head(qkv, layer, head)
    x = (qkv.k if which == "k" else qkv.v)[layer, head]  # [T, D]
    return (rotated(x) if rotate else x).abs().T.numpy()


OUTLIER_RATIO = "outlier ratio"  # the one name the Quantization view gives :func:`outlier_ratio`
OUTLIER_RATIO_MEANS = "the largest channel's mean |x| ÷ the median channel's"


def outlier_ratio(channel_means: np.ndarray) -> np.ndarray:
    """The outlier ratio along the last axis: the largest channel's mean |x| over the median channel's (numpy's
    median: the mean of the two middle channels of an even count). Every number the view shows uses this one."""
    m = np.asarray(channel_means, dtype=np.float64)
    return m.max(-1) / np.maximum(np.median(m, axis=-1), 1e-12)


def channel_outlier_ratio(qkv: QKV, which: str = "k", rotate: bool = False) -> np.ndarray:
    """Per layer and KV head: the :func:`outlier_ratio` of its channels ([Lyr, Hkv]).

    Large for keys (a few channels are large for every token), near 1–3 for values; ``rotate``: after the
    Hadamard turn, which spreads the large channels over all of them.
    """
    x = qkv.k if which == "k" else qkv.v
    x = (rotated(x) if rotate else x).abs().mean(2)  # [Lyr, Hkv, D]
    return outlier_ratio(x.float().numpy())


def median_outlier_ratio(qkv: QKV, which: str = "k", rotate: bool = False) -> float:
    """The median over every layer and KV head of :func:`channel_outlier_ratio`: the view's one summary of it."""
    return float(np.median(channel_outlier_ratio(qkv, which, rotate)))


def check_layer_head(qkv: QKV, layer: int, head: int) -> None:
    if not 0 <= layer < qkv.layers:
        raise ValueError(f"layer must be in 0…{qkv.layers - 1}, got {layer}.")
    if not 0 <= head < qkv.kv_heads:
        raise ValueError(f"KV head must be in 0…{qkv.kv_heads - 1}, got {head}.")
