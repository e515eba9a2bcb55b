"""Attention sinks: how much attention lands on the first tokens, per layer and head, and why.

Every number here comes from a finished :class:`~kvviz.capture.trace.Trace`. The fraction on the first
``k`` tokens is read from the column sums, so any ``k`` works after the run: each fed query hands
out exactly one unit of attention, and the queries 0 … k-1 can see nothing but the first k tokens,
so ``(Σ colsum[:k] − k) / (n_fed − k)`` is the mean fraction over the queries that had a choice.
Models with learned sinks (gpt-oss) give part of each unit to a per-head sink logit instead of any
token; that share is recorded on its own (``learned_sink_mass``), subtracted from the first queries'
unit above, and shown next to the emergent sinks on the first tokens.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvviz.capture.trace import ModelInfo, Trace


def check_k(trace: Trace, k: int) -> int:
    """``k`` as an int, or a ValueError that says which values work for this trace."""
    try:
        k_int = int(k)
    except (TypeError, ValueError, OverflowError):
        raise ValueError("k (the number of first tokens counted as sinks) must be a whole number.") from None
    if k_int != k or not 1 <= k_int < trace.n_fed:
        raise ValueError(
            f"k must be a whole number from 1 to {trace.n_fed - 1} for this run "
            f"({trace.n_fed} tokens went through the model)."
        )
    if trace.colsum is None:
        raise ValueError("This trace has no attention summaries (the run did not finish).")
    return k_int


def sink_fraction(trace: Trace, k: int = 4) -> np.ndarray:
    """[Lyr, Hq]: mean fraction of each query's attention on the first ``k`` positions (0–1).

    Averaged over the fed queries at positions ≥ k (earlier ones could only look there).
    """
    k = check_k(trace, k)
    on_first = trace.colsum[..., :k].astype(np.float64).sum(-1)  # [Lyr, Hq]
    given_by_first = float(k)  # queries 0 … k-1 give the first k tokens all they give to tokens
    if trace.learned_sink_mass is not None:
        given_by_first = k - trace.learned_sink_mass[..., :k].astype(np.float64).sum(-1)
    return np.clip((on_first - given_by_first) / (trace.n_fed - k), 0.0, 1.0)


def learned_sink_fraction(trace: Trace, k: int = 4) -> np.ndarray | None:
    """[Lyr, Hq]: mean share of each query's attention that went to its head's learned sink (gpt-oss),
    over the same queries as :func:`sink_fraction`; None for models without learned sinks."""
    k = check_k(trace, k)
    if trace.learned_sink_mass is None:
        return None
    return np.clip(trace.learned_sink_mass[..., k : trace.n_fed].astype(np.float64).mean(-1), 0.0, 1.0)


def uniform_fraction(n_fed: int, k: int) -> float:
    """The same average if every query spread its attention evenly over what it can see:
    mean of k / (i + 1) over query positions i = k … n_fed − 1 (the no-sink baseline)."""
    if not 1 <= k < n_fed:
        raise ValueError(f"k must be from 1 to {n_fed - 1}.")
    i = np.arange(k, n_fed)
    return float(np.mean(k / (i + 1)))


def sink_frame(trace: Trace, k: int = 4) -> pd.DataFrame:
    """Layers × query heads table of sink fractions in percent (rows ``layer``, columns ``q0`` …)."""
    frac = sink_fraction(trace, k) * 100
    df = pd.DataFrame(frac.round(1), columns=[f"q{h}" for h in range(frac.shape[1])])
    df.insert(0, "layer", range(frac.shape[0]))
    return df


def layer_sink_line(trace: Trace, k: int = 4) -> pd.DataFrame:
    """Per layer: mean, min and max over heads of the sink fraction (0–1), the uniform baseline, and
    for models with learned sinks the mean share on them (``learned``)."""
    frac = sink_fraction(trace, k)
    df = pd.DataFrame(
        {
            "layer": np.arange(frac.shape[0]),
            "mean": frac.mean(1),
            "min": frac.min(1),
            "max": frac.max(1),
            "uniform": uniform_fraction(trace.n_fed, int(k)),
        }
    )
    learned = learned_sink_fraction(trace, k)
    if learned is not None:
        df["learned"] = learned.mean(1)
    return df


def sink_norms(trace: Trace, k: int = 4) -> pd.DataFrame:
    """Per layer: mean L2 norm of the keys and values of the first ``k`` tokens vs all other cached
    tokens (averaged over KV heads; tokens a cache no longer holds are left out)."""
    k = check_k(trace, k)
    sink, other = span_norms(trace, 0, k), span_norms(trace, k, trace.n_tokens)
    return pd.DataFrame(
        {
            "layer": sink["layer"],
            "key_sink": sink["key"],
            "key_other": other["key"],
            "value_sink": sink["value"],
            "value_other": other["value"],
        }
    )


def span_norms(trace: Trace, start: int, stop: int) -> pd.DataFrame:
    """Per layer: mean key and value L2 norm over positions ``start … stop-1`` and all KV heads
    (NaN where the cache holds none of them)."""
    if trace.key_norms is None or trace.value_norms is None:
        raise ValueError("This trace has no key/value norms.")
    if not 0 <= start < stop <= trace.n_tokens:
        raise ValueError(f"positions must satisfy 0 <= start < stop <= {trace.n_tokens}.")
    return pd.DataFrame(
        {
            "layer": np.arange(trace.key_norms.shape[0]),
            "key": _nanmean(trace.key_norms[..., start:stop]),
            "value": _nanmean(trace.value_norms[..., start:stop]),
        }
    )


def _nanmean(x: np.ndarray) -> np.ndarray:
    """Mean over every axis but the first, ignoring NaN (positions not held); NaN if none held."""
    flat = x.reshape(x.shape[0], -1)
    held = ~np.isnan(flat)
    total = np.where(held, flat, 0.0).sum(1)
    count = held.sum(1)
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def kv_groups(info: ModelInfo) -> list[list[int]]:
    """Query heads that share each KV head: ``groups[kv] = [q, …]`` (transformers' repeat_kv order)."""
    g = info.group_size
    return [list(range(kv * g, (kv + 1) * g)) for kv in range(info.kv_heads)]


def kv_head_of(info: ModelInfo, head: int) -> int:
    """The KV head query head ``head`` reads."""
    if not 0 <= head < info.q_heads:
        raise ValueError(f"head must be from 0 to {info.q_heads - 1}.")
    return head // info.group_size


def group_text(info: ModelInfo, head: int) -> str:
    """One line a student can read: which query heads share this head's keys and values."""
    kv = kv_head_of(info, head)
    members = kv_groups(info)[kv]
    if info.group_size == 1:
        return f"Query head {head} has its own KV head ({info.kv_heads} KV heads: multi-head attention)."
    kind = "multi-query attention: one KV head for all" if info.kv_heads == 1 else "grouped-query attention"
    return (
        f"Query head {head} reads KV head {kv}, shared with query heads "
        f"{', '.join(str(m) for m in members if m != head)} ({kind}; {info.q_heads} query / "
        f"{info.kv_heads} KV heads)."
    )


def top_received(trace: Trace, n: int = 8, layers: slice | None = None) -> pd.DataFrame:
    """The ``n`` positions that received the most attention per query on average (all heads of the
    chosen layers): the first token usually tops it, and other sink-like tokens show up too."""
    cs = trace.colsum if layers is None else trace.colsum[layers]
    per_query = cs.mean(axis=(0, 1)) / max(trace.n_fed, 1)  # [T] fraction of a query's attention
    order = np.argsort(-per_query)[: max(int(n), 1)]
    return pd.DataFrame({"position": order, "token": [trace.tokens[i] for i in order], "share": per_query[order]})
