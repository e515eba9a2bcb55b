"""Figures for the live cache of each architecture: a tiny model's real cache next to the formula.

Pure functions of a :class:`~kvviz.capture.architectures.LiveCache`; each view has a one-sentence caption in
``CAPTIONS``. Sizes are bytes of the fp32 tiny models (binary units where abbreviated).
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from kvviz.capture.architectures import LiveCache
from kvviz.units import format_bytes

CAPTIONS = {
    "table": "Each layer's cache as transformers stores it after the run: the tensors' shapes ([batch, heads, "
    "tokens, dim]), the bytes they hold, and the memory calculator's bytes for the same config and tokens.",
    "chart": "Bytes per layer measured from the cache tensors, one stacked segment per kind of tensor (K/V or "
    "MLA's latent and RoPE key, a sparse-attention indexer's keys, a linear-attention layer's fixed state), next "
    "to the formula's; for MLA the third bar is what per-head keys and values of the same attention would take, "
    "the size the chapter's pitfall (forgetting MLA's special shape) would report.",
    "steps": "Each layer's bytes measured from its cache tensors after the prefill and after every decode step "
    "(dots: the formula's), so a full-attention layer climbs by one token's K/V per step while a sliding layer "
    "stops at its window, a linear-attention layer's fixed state stays flat and a KV-sharing layer stays at zero.",
    "attention": "The attention the capture recorded on the last layer that attends, averaged over its query heads "
    "(rows: the prompt's last queries; columns: the prompt tokens; each row sums to 1); a linear-attention layer "
    "computes no attention probabilities, so the trace marks its rows absent rather than drawing zeros.",
}


def _kind(live: LiveCache, layer: int) -> str:
    if live.kv_sources[layer] is not None:
        return "shared"
    return next((t.layer_kind for t in live.tensors if t.layer == layer), "")


def cache_table(live: LiveCache) -> pd.DataFrame:
    """One row per layer: kind, tensors with shapes, tokens held, measured and formula bytes (K/V and fixed state)."""
    rows = []
    per_layer = zip(
        live.tokens_held, live.layer_bytes, live.formula_layer_bytes, live.state_bytes, live.formula_state_bytes
    )
    for layer, (held, measured, formula, state, formula_state) in enumerate(per_layer):
        parts = [t for t in live.tensors if t.layer == layer]
        source = live.kv_sources[layer]
        rows.append(
            {
                "layer": layer,
                "kind": _kind(live, layer),
                "tensors": " + ".join(f"{t.name} {list(t.shape)}" for t in parts)
                or (f"none of its own: attends to layer {source}'s K/V" if source is not None else "none"),
                "tokens held": held,
                "measured bytes": measured,
                "formula bytes": formula,
                "state bytes (measured / formula)": f"{state:,} / {formula_state:,}",
                "equal": "✓" if (measured, state) == (formula, formula_state) else "✗",
            }
        )
    return pd.DataFrame(rows)


def steps_chart(live: LiveCache) -> go.Figure:
    """Bytes per layer (K/V + fixed state) measured at every step of the run, the formula's as dots."""
    fig = go.Figure()
    x = [s.tokens_seen for s in live.steps]
    for layer in range(len(live.layer_bytes)):
        name = f"layer {layer} ({_kind(live, layer)})"
        measured = [s.layer_bytes[layer] + s.state_bytes[layer] for s in live.steps]
        formula = [s.formula_layer_bytes[layer] + s.formula_state_bytes[layer] for s in live.steps]
        fig.add_trace(
            go.Scatter(
                x=x, y=measured, mode="lines", name=name, legendgroup=name,
                hovertemplate="%{x} tokens: %{y:,} B measured<extra>" + name + "</extra>",
            )
        )  # fmt: skip
        fig.add_trace(
            go.Scatter(
                x=x, y=formula, mode="markers", name=f"{name}, formula", legendgroup=name, showlegend=False,
                marker=dict(size=5, symbol="circle-open"),
                hovertemplate="%{x} tokens: %{y:,} B by the formula<extra>" + name + "</extra>",
            )
        )  # fmt: skip
    fig.update_layout(
        title=f"{live.kind}: each layer's cache bytes as the tokens grow",
        xaxis_title="tokens seen",
        yaxis_title="bytes (fp32)",
        height=340,
        margin=dict(l=60, r=20, t=50, b=40),
        legend=dict(font=dict(size=10)),
    )
    return fig


def attention_chart(live: LiveCache) -> go.Figure:
    """Heatmap of the recorded prompt rows (mean over heads) of the last attending layer; the title names
    the layers recorded and those without attention."""
    fig = go.Figure()
    recorded, trace = live.attention_layers, live.trace
    if not recorded or trace is None or trace.window_rows is None:
        fig.update_layout(title=f"{live.kind}: no attention recorded", height=320)
        return fig
    layer = recorded[-1]
    rows = trace.window_rows[layer].mean(0)  # [W, L]: the last W prompt queries over the prompt's keys
    q0 = trace.n_prompt - rows.shape[0]
    fig.add_trace(
        go.Heatmap(
            z=rows, x=list(range(trace.n_prompt)), y=list(range(q0, trace.n_prompt)), colorscale="Viridis",
            colorbar=dict(title="share"), hovertemplate="query %{y} → key %{x}: %{z:.3f}<extra></extra>",
        )
    )  # fmt: skip
    absent = [i for i in range(len(live.layer_bytes)) if i not in recorded]
    none = f"; none on layers {', '.join(map(str, absent))} (no attention)" if absent else ""
    fig.update_layout(
        title=f"{live.kind}: attention recorded on layers {', '.join(map(str, recorded))}{none}; layer {layer} shown",
        xaxis_title="key position (prompt)",
        yaxis_title="query position",
        yaxis_autorange="reversed",
        height=320,
        margin=dict(l=60, r=20, t=50, b=40),
        title_font_size=12,
    )
    return fig


SEGMENTS = {  # the measured bar's stacked segments: name, colour, which tensors
    "kv": ("measured: K/V (cache tensors)", "#1f77b4"),
    "index": ("measured: indexer keys", "#17becf"),
    "state": ("measured: fixed state (conv + recurrent)", "#2ca02c"),
}


def _segment(name: str) -> str:
    return "state" if name.endswith("state") else "index" if name == "indexer keys" else "kv"


def measured_segments(live: LiveCache) -> dict[str, list[int]]:
    """Per kind of tensor (:data:`SEGMENTS`), each layer's measured bytes; K/V always, the others where held."""
    n = len(live.layer_bytes)
    out = {key: [0] * n for key in SEGMENTS}
    for t in live.tensors:
        out[_segment(t.name)][t.layer] += t.bytes
    return {key: v for key, v in out.items() if key == "kv" or any(v)}


def bytes_chart(live: LiveCache) -> go.Figure:
    """Bars per layer: the measured bytes stacked by kind of tensor, the formula's beside them (and per-head
    K/V for MLA)."""
    x = [f"layer {i} ({_kind(live, i)})" for i in range(len(live.layer_bytes))]
    fig = go.Figure()
    base = [0] * len(x)
    for key, values in measured_segments(live).items():
        name, colour = SEGMENTS[key]
        if key == "kv" and live.attention == "MLA":
            name = "measured: latent + RoPE key"
        fig.add_bar(
            x=x, y=values, base=list(base), offsetgroup="measured", name=name, marker_color=colour,
            hovertemplate="%{x}: %{y:,} B " + name.removeprefix("measured: ") + "<extra></extra>",
        )  # fmt: skip
        base = [b + v for b, v in zip(base, values)]
    formula = [a + b for a, b in zip(live.formula_layer_bytes, live.formula_state_bytes)]
    fig.add_bar(
        x=x, y=formula, offsetgroup="formula", name="formula (memory calculator)", marker_color="#ff7f0e",
        hovertemplate="%{x}: %{y:,} B by the formula<extra></extra>",
    )  # fmt: skip
    if live.attention == "MLA":
        per_layer = live.per_head_bytes_per_token // len(live.layer_bytes)
        fig.add_bar(
            x=x, y=[n * per_layer for n in live.tokens_held], offsetgroup="per-head",
            name="per-head K/V (the pitfall)", marker_color="#adb5bd",
            hovertemplate="%{x}: %{y:,} B if cached per head<extra></extra>",
        )  # fmt: skip
    fig.update_layout(
        title=f"{live.kind}: cache bytes per layer after {live.tokens_seen} tokens",
        barmode="group",
        yaxis_title="bytes (fp32)",
        height=340,
        margin=dict(l=60, r=20, t=50, b=40),
        legend=dict(orientation="h", y=-0.2),
    )
    return fig


def summary_markdown(live: LiveCache) -> str:
    """What the tiny model is, what its cache holds per token, and whether the formula agrees."""
    verdict = "equal, layer by layer, at every step ✓" if live.agrees else "**different** ✗ (please report this)"
    check = (
        f"captured logits within {live.max_abs_logit_diff_vs_unpatched:.0e} of the model's own"
        if live.max_abs_logit_diff_vs_unpatched is not None
        else "equivalence check not run"
    )
    text = (
        f"**{live.kind}** — {live.label}. A tiny random-weight `{live.model_type}` read {live.tokens_seen} "
        f"tokens in {live.elapsed_s:.2f} s ({check}). Cache measured from its tensors: "
        f"**{live.cache_bytes:,} B = {format_bytes(live.cache_bytes)}**{_split(live)}; the formula: "
        f"**{live.formula_cache_bytes:,} B** — {verdict}. Per token (every layer, no window): "
        f"**{live.bytes_per_token:,} B** measured, formula {live.formula} = {live.formula_bytes_per_token:,} B"
    )
    fixed = sum(live.state_bytes)
    text += (
        f"; plus **{fixed:,} B** fixed whatever the length, formula {live.fixed_formula} = "
        f"{sum(live.formula_state_bytes):,} B."
        if fixed
        else "."
    )
    if live.attention == "MLA":
        ratio = live.per_head_bytes_per_token / max(live.bytes_per_token, 1)
        text += (
            f"\n\nMLA's special shape, on a real transformers cache: each layer stores one latent and one RoPE "
            f"key per token (the latent and RoPE-key tensors above; heads = 1), no factor 2 and no head count. Attention "
            f"expands them to every head's key and value on the fly; caching those instead would take "
            f"{live.per_head_bytes_per_token:,} B per token, {ratio:.0f}× more — the number the pitfall gives."
        )
    text += "".join(f"\n\n{extra}" for extra in _new_caches(live))
    if live.learned_sink_share is not None:
        text += (
            f"\n\nThe learned sinks took {live.learned_sink_share:.0%} of the attention on average. A sink is one "
            "logit per head, not a token: nothing in the cache holds it, so the bytes are plain K/V."
        )
    return text


def _split(live: LiveCache) -> str:
    """The headline's parts where the cache holds a fixed state beside what grows with the tokens."""
    fixed = sum(live.state_bytes)
    if not fixed:
        return ""
    return f" ({live.measured_bytes:,} B that grow with the tokens + {fixed:,} B of fixed state)"


def _layers(indices) -> str:
    return f"layer{'s' if len(indices) != 1 else ''} {', '.join(map(str, indices))}"


def _growth(live: LiveCache) -> str:
    """Which layers grow with the context and which stay flat, read from the bytes measured at each step."""
    growing = live.growing_layers
    flat = [i for i, b in enumerate(live.layer_bytes) if b and i not in growing]
    empty = [i for i, b in enumerate(live.layer_bytes) if not b]
    grow = "grows" if len(growing) == 1 else "grow"
    out = f"only {_layers(growing)} of the {len(live.layer_bytes)} {grow} with the context (measured step by step)"
    if flat:
        sizes = sorted({live.layer_bytes[i] for i in flat})
        each = f"{sizes[0]:,} B each" if len(sizes) == 1 else ", ".join(f"{live.layer_bytes[i]:,} B" for i in flat)
        kinds = {_kind(live, i) for i in flat}
        why = " (their sliding window)" if kinds == {"sliding"} else ""
        out += f"; {_layers(flat)} stay flat at {each}{why}"
    if empty:
        out += f"; {_layers(empty)} hold nothing"
    return out


def _new_caches(live: LiveCache) -> list[str]:
    """What cross-layer sharing, sparse-attention indexer keys and linear-attention state add, measured."""
    out = []
    shared = [i for i, src in enumerate(live.kv_sources) if src is not None]
    if shared:
        out.append(
            f"Cross-layer KV sharing, on a real transformers cache: layers {', '.join(map(str, shared))} compute "
            f"queries but no keys or values; each attends to an earlier layer's (table), and its cache layer, a "
            f"`DummyLayer`, holds **{sum(live.layer_bytes[i] for i in shared)} B**: {_growth(live)}."
        )
    index = sum(t.bytes for t in live.tensors if t.name == "indexer keys")
    if index:
        out.append(
            f"DeepSeek sparse attention: beside the latent, each layer caches one small indexer key per token "
            f"(**{index:,} B** of the {live.measured_bytes:,} B); the indexer scores every cached token against the "
            f"new query with these keys and selects the {live.index_topk} highest-scoring positions, the only "
            "ones the query's attention reads — the cache still holds every token."
        )
    if any(live.state_bytes):
        state = [b for b in live.state_bytes if b]
        first, last = live.steps[0], live.steps[-1]
        flat = all(s.state_bytes == first.state_bytes for s in live.steps)
        out.append(
            f"Linear attention: {len(state)} layers keep a fixed conv + recurrent state of **{state[0]:,} B** each, "
            f"measured at every step from {first.tokens_seen} to {last.tokens_seen} tokens "
            f"({'the same every time' if flat else '**changing** ✗'}), while the full-attention layer grew from "
            f"{sum(first.layer_bytes):,} B to {sum(last.layer_bytes):,} B."
        )
        recorded = live.attention_layers
        linear = [i for i, b in enumerate(live.state_bytes) if b and i not in recorded]
        out.append(
            f"Attention recorded on layer{'s' if len(recorded) != 1 else ''} {', '.join(map(str, recorded))} "
            f"(full attention) and on none of layers {', '.join(map(str, linear))}: a gated-DeltaNet layer folds "
            "each token into its state and computes no attention probabilities, so the trace marks them absent."
        )
    return out


def look_for(live: LiveCache) -> str:
    """The Learn tab's "Look for" line for this run: its own numbers, each of them shown in the summary."""
    fixed, shared = sum(live.state_bytes), [i for i, src in enumerate(live.kv_sources) if src is not None]
    if fixed:
        state = [b for b in live.state_bytes if b]
        return (
            f"{len(state)} gated-DeltaNet layers keep a fixed state of {state[0]:,} B each, the same at every step: "
            f"{fixed:,} B of fixed state beside {live.measured_bytes:,} B that grow with the tokens, "
            f"{live.cache_bytes:,} B in all — a fixed size, not no size."
        )
    if shared:
        return f"The KV-sharing layers hold 0 B of their own: {_growth(live)}; the cache holds {live.cache_bytes:,} B."
    if live.attention == "MLA":
        return (
            f"One latent and one RoPE key per token and layer: {live.bytes_per_token:,} B per token, where per-head "
            f"keys and values would take {live.per_head_bytes_per_token:,} B per token."
        )
    if live.attention == "GQA":
        return (
            f"Keys and values are kept per KV head, not per query head: {live.formula} = "
            f"{live.formula_bytes_per_token:,} B per token, {live.bytes_per_token:,} B measured; {live.cache_bytes:,} B "
            f"for the {live.tokens_seen} tokens read."
        )
    return f"The cache holds {live.cache_bytes:,} B, {live.bytes_per_token:,} B per token, equal to the formula."
