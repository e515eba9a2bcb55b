"""Quantization tab: outlier key channels, every scheme's error and bytes, and generation on a quantized cache."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import gradio as gr
import pandas as pd

from kvviz.capture.model_io import encode_prompt
from kvviz.figures import quant as fig
from kvviz.lessons.objectives import KIVI
from kvviz.quant.cache import compare_generation
from kvviz.quant.model import (
    QKV,
    channel_outlier_ratio,
    collect_qkv,
    compare,
    evaluate,
    magnitude_map,
    median_outlier_ratio,
)
from kvviz.quant.schemes import QuantSpec, Scheme, preset_schemes, rotation_schemes
from kvviz.safety import whole_number
from kvviz.ui.page.first_sight import Example, once
from kvviz.ui.page.widgets import clear_on_refusal
from kvviz.ui.quant_layout import CUSTOM, QuantViews, layout
from kvviz.ui.serving.context import AppContext, ShowMeAnswer
from kvviz.ui.serving.job import Size
from kvviz.ui.serving.jobs import UserError
from kvviz.ui.serving.model_job import ModelJob, prompt_ids
from kvviz.ui.serving.precompute import shared
from kvviz.ui.serving.sessions import user_errors
from kvviz.units import format_bytes

MAX_PROMPT = 1024  # tokens analysed (Q, K, V of every layer are held in memory for the view)
WHY = (
    "**Why this decides the grouping.** A scale must stretch to cover the largest value in its group. Per token, "
    "an outlier channel sits in every token's group and leaves the ordinary channels only a level or two at 2 bits; "
    "per channel, the outlier gets its own scale and the others keep theirs (KIVI). Values have no such channels, "
    "and each attention output mixes value *rows*, so values are grouped per token."
)


@dataclass
class Analysis:
    """One prompt's analysis: the key/value maps, every scheme's error and bytes, and the rotation beside KIVI."""

    kmap: object
    vmap: object
    maps_text: str
    headline: str
    table: pd.DataFrame
    errors: object
    sizes: object
    layers: object
    rmap: object
    rbars: object
    rotation_text: str


@dataclass
class Maps:
    """The magnitude maps of one layer and KV head (the layer or head changed)."""

    kmap: object
    vmap: object
    text: str
    rmap: object


@dataclass
class Generated:
    """Full vs quantized generation: both texts, the summary, token by token, and the session's agreement."""

    full_text: str
    quant_text: str
    summary: str
    tokens: pd.DataFrame
    agreement: object
    history: list


def custom_scheme(fmt: str, key_axis: str, value_axis: str, group: int, window: int) -> Scheme:
    """The scheme set by the controls (ValueError → gr.Error by the caller)."""
    g = int(group)
    return Scheme("Your scheme", QuantSpec(fmt, key_axis, g, int(window)), QuantSpec(fmt, value_axis, g, int(window)))


def _schemes(custom: Scheme, group: int, window: int) -> list[Scheme]:
    return [*preset_schemes(int(group), int(window)), custom]


def _qkv_ids(ctx: AppContext, prompt: str, chat: bool) -> list[int]:
    """The prompt's token ids, or a UserError saying what to fix."""
    if prompt is None or not str(prompt).strip():
        raise UserError("The prompt is empty: type some text (a few hundred tokens shows the structure best).")
    ids = encode_prompt(ctx.lm, str(prompt), bool(chat))
    limit = min(MAX_PROMPT, ctx.settings.max_prompt_tokens)
    if len(ids) > limit:
        raise UserError(f"The prompt is {len(ids):,} tokens; this view analyses at most {limit:,}. Shorten it.")
    return ids


# the settings of ``analyze`` and ``generate`` by name, in the order their widgets are wired
ANALYSIS = ("prompt", "chat", "layer", "head", "fmt", "key_axis", "value_axis", "group", "window")
GENERATE = ("prompt", "chat", "choice", "fmt", "key_axis", "value_axis", "group", "window", "max_new", "history")


@dataclass(frozen=True)
class Ask:
    """A checked request of the tab: its settings by the name of the function's parameter, the prompt's
    length in tokens, the new tokens; for a stored analysis its key, computation and *Recompute live*."""

    settings: dict
    n_prompt: int
    n_new: int = 0
    key: tuple = ()
    compute: Callable | None = None
    live: bool = False


def _same(value) -> object:
    """A control's value as a store key part: 15 and 15.0 from a slider are the same setting."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


def _qkv(ctx: AppContext, prompt: str, chat: bool) -> QKV:
    ids = _qkv_ids(ctx, prompt, chat)
    with user_errors():
        return collect_qkv(ctx.lm, ids=ids)


def maps_text(qkv: QKV, layer: int, head: int) -> str:
    k, v = channel_outlier_ratio(qkv, "k"), channel_outlier_ratio(qkv, "v")
    return f"{fig.maps_story(k, v, layer, head, qkv.n_tokens)}\n\n{WHY}"


def values_text(tok, ch, both_ch) -> str:
    """What the value columns say about KIVI's per-token values (the text lives in the figures module)."""
    return fig.values_story(tok, ch, both_ch)


def analyze(
    ctx: AppContext, prompt, chat, layer, head, fmt, key_axis, value_axis, group, window, progress=gr.Progress()
) -> Analysis:
    """Maps for the chosen layer/head, then every scheme scored on this prompt's real Q/K/V."""
    progress(0.0, desc="Prefill: collecting queries, keys and values")
    qkv = _qkv(ctx, prompt, chat)
    layer, head = int(layer), int(head)
    with user_errors():
        custom = custom_scheme(fmt, key_axis, value_axis, group, window)
        kmap, vmap = magnitude_map(qkv, layer, head, "k"), magnitude_map(qkv, layer, head, "v")
        # every row scores the same tokens: per-channel groups quantize only whole groups of tokens
        scored = qkv.crop(qkv.n_tokens - qkv.n_tokens % int(group)) if qkv.n_tokens >= int(group) else qkv
        table, results = compare(scored, _schemes(custom, group, window), progress=progress)
        rot = [evaluate(scored, s) for s in rotation_schemes(group_size=int(group))]
        rmap = magnitude_map(qkv, layer, head, "k", rotate=True)
    turn = (median_outlier_ratio(qkv, "k", r) for r in (False, True))
    shown = [
        r
        for r in results
        if r.scheme.name in ("2-bit per token (K and V)", "2-bit K per channel, V per token")
        or r.scheme.name.startswith("KIVI")
        or r is results[-1]
    ]
    by = {r.scheme.name: r for r in results}
    tok, ch = by["2-bit per token (K and V)"], by["2-bit K per channel, V per token"]
    both_ch = by["2-bit per channel (K and V)"]
    mine = results[-1]
    if ch.key_quantized == 0:
        first = (
            f"**This prompt is too short for per-channel groups:** {qkv.n_tokens} tokens, and a channel group "
            f"is quantized only once {int(group)} tokens are there (until then KIVI keeps them in full precision). "
            f"Keys per token at 2 bits already lose {100 * tok.key_error:.1f} %. Use a longer prompt."
        )
    else:
        first = (
            f"**At 2 bits on this prompt:** keys per channel lose **{100 * ch.key_error:.1f} %** of their norm, "
            f"keys per token **{100 * tok.key_error:.1f} %** ({tok.key_error / ch.key_error:.1f}× worse); the "
            f"attention output is off by {100 * ch.output_error:.1f} % vs {100 * tok.output_error:.1f} %. "
            f"Every row scores the same first {scored.n_tokens} of {qkv.n_tokens} tokens (per-channel groups "
            f"of {int(group)} tokens are quantized only once full).\n\n{values_text(tok, ch, both_ch)}"
            f"\n\n{fig.OUTPUT_VS_ANSWER}"
        )
    headline = (
        f"{first}\n\n**Your scheme** ({mine.scheme.key.label} for keys; {mine.scheme.value.label} for "
        f"values): K {100 * mine.key_error:.2f} %, V {100 * mine.value_error:.2f} %, output "
        f"{100 * mine.output_error:.2f} %, {format_bytes(mine.total_bytes)} ({mine.compression:.2f}× smaller "
        "than 16-bit)."
    )
    return Analysis(
        fig.magnitude_map(kmap, qkv.tokens, "keys", layer, head),
        fig.magnitude_map(vmap, qkv.tokens, "values", layer, head),
        maps_text(qkv, layer, head),
        headline,
        table,
        fig.error_bars(results),
        fig.bytes_bars(results),
        fig.layer_errors(shown),
        fig.magnitude_map(rmap, qkv.tokens, "keys after the Hadamard turn", layer, head),
        fig.error_bars(rot),
        fig.rotation_story(rot, *turn),
    )


def maps(ctx: AppContext, prompt, chat, layer, head) -> Maps:
    """Only the two magnitude maps (layer or head changed)."""
    qkv = _qkv(ctx, prompt, chat)
    layer, head = int(layer), int(head)
    with user_errors():
        kmap, vmap = magnitude_map(qkv, layer, head, "k"), magnitude_map(qkv, layer, head, "v")
        rmap = magnitude_map(qkv, layer, head, "k", rotate=True)
    return Maps(
        fig.magnitude_map(kmap, qkv.tokens, "keys", layer, head),
        fig.magnitude_map(vmap, qkv.tokens, "values", layer, head),
        maps_text(qkv, layer, head),
        fig.magnitude_map(rmap, qkv.tokens, "keys after the Hadamard turn", layer, head),
    )


def _max_new(ctx: AppContext, value) -> int:
    with user_errors():
        return whole_number(value, "Max new tokens", 1, min(64, ctx.settings.max_new_tokens))


def generate(
    ctx: AppContext,
    prompt,
    chat,
    choice,
    fmt,
    key_axis,
    value_axis,
    group,
    window,
    max_new,
    history,
    progress=gr.Progress(),
) -> Generated:
    """Generate with the full and the quantized cache; texts side by side, agreement accumulated per session."""
    if prompt is None or not str(prompt).strip():
        raise UserError("The prompt is empty: type some text.")
    n_new = _max_new(ctx, max_new)
    if not 1 <= n_new <= min(64, ctx.settings.max_new_tokens):
        raise UserError(f"Max new tokens must be between 1 and {min(64, ctx.settings.max_new_tokens)}.")
    with user_errors():
        custom = custom_scheme(fmt, key_axis, value_axis, group, window)
        schemes = {s.name: s for s in _schemes(custom, group, window)}
        schemes.update({s.name: s for s in rotation_schemes(group_size=int(group))})
        scheme = custom if choice == CUSTOM else schemes.get(choice)
        if scheme is None:
            raise ValueError(f"Unknown scheme {choice!r}.")
        ids = encode_prompt(ctx.lm, str(prompt), bool(chat))
        if len(ids) > min(MAX_PROMPT, ctx.settings.max_prompt_tokens):
            raise ValueError(f"The prompt is {len(ids):,} tokens; this view generates from at most {MAX_PROMPT:,}.")
        progress(0.1, desc=f"Generating with the full and the {scheme.name} cache")
        cmp = compare_generation(ctx.lm, str(prompt), scheme, n_new, bool(chat), ids=ids)
    history = [c for c in (history or []) if c.scheme.name != cmp.scheme.name] + [cmp]
    div = "never" if cmp.first_divergence is None else f"at generated token {cmp.first_divergence + 1}"
    summary = (
        f"**{cmp.scheme.name}:** top-1 agreement **{100 * cmp.agreement:.0f} %** over {cmp.steps} steps, "
        f"mean KL {cmp.mean_kl:.4f} nats; the free-running texts part {div}. Cache: "
        f"{format_bytes(cmp.packed_bytes)} packed vs {format_bytes(cmp.full_cache_bytes)} in 16-bit "
        "(simulated: the values are stored dequantized)."
    )
    return Generated(
        cmp.full_text, cmp.quant_text, summary, fig.side_by_side_frame(cmp), fig.agreement_bars(history), history
    )


def build(ctx: AppContext) -> None:
    """Build the Quantization tab inside the caller's ``gr.Tab``: its layout, then its wiring."""
    _wire(ctx, layout(ctx, [s.name for s in preset_schemes() + rotation_schemes()] + [CUSTOM]))


def _wire(ctx: AppContext, v: QuantViews) -> None:
    """Register the tab's inputs, its show-me plan and answer and its first-open example; wire its three runs
    (each a :class:`~kvviz.ui.serving.model_job.ModelJob`: validate → call kvviz → format by name)."""
    controls = v.controls()
    ctx.components.update({**controls, "quant.button": v.analyze_btn, "quant.scheme": v.scheme})
    ctx.components.update({"quant.max_new": v.max_new, "quant.generate": v.gen_btn})

    def analysis_job(values, live: bool = False) -> Ask:
        """One analysis, its settings by ``analyze``'s names (the prompt checked and tokenized first), its store
        key and computation."""
        s = dict(zip(ANALYSIS, values))
        n = len(_qkv_ids(ctx, s["prompt"], s["chat"]))

        def compute(report, should_stop):
            return analyze(ctx, **s, progress=lambda f, desc="": report(f, desc))

        return Ask(s, n, 0, (ctx.lm.name, "quant", n, *[_same(x) for x in values]), compute, bool(live))

    def plan(values: dict) -> tuple:
        a = analysis_job([values.get(k, c.value) for k, c in controls.items()])
        ctx.store.plan(a.key, "quantization analysis", a.compute)
        return a.key

    ctx.planners["quant.button"] = plan

    def run_analyze(job) -> dict:
        a: Ask = job.req
        return v.analysis(shared(job, a.key, a.compute, live=a.live)[0])

    def run_maps(job) -> dict:
        return v.maps(maps(ctx, **job.req.settings))

    def run_generate(job) -> dict:
        return v.generated(generate(ctx, **job.req.settings, progress=job.progress))

    def maps_request(_ctx, *values) -> Ask:
        s = dict(zip(ANALYSIS[:4], values))
        return Ask(s, len(prompt_ids(ctx, s["prompt"], s["chat"])[1]))

    def gen_request(_ctx, *values) -> Ask:
        s = dict(zip(GENERATE, values))
        n_new = _max_new(ctx, s["max_new"])
        return Ask(s, len(prompt_ids(ctx, s["prompt"], s["chat"], n_new)[1]), n_new)

    analysis_run = ModelJob(
        "quantization analysis",
        check=lambda _ctx, live, *settings: analysis_job(settings, live),
        run=run_analyze,
        size=lambda a: Size(a.n_prompt, 0),
        store=True,
        progress=True,
    )
    maps_run = ModelJob("key/value maps", check=maps_request, run=run_maps, size=lambda a: Size(a.n_prompt, 0))
    generate_run = ModelJob(
        "quantized generation",
        check=gen_request,
        run=run_generate,
        size=lambda a: Size(a.n_prompt, a.n_new, runs=2),
        progress=True,
    )

    def stored_analysis(request: gr.Request, live, *settings) -> dict | None:
        """The analysis's outputs when its result is stored (for a show-me), else None."""
        entry = ctx.store.entry(analysis_job(settings).key)
        if entry is None or entry.state != "done":
            return None
        return v.analysis(entry.value)

    inputs = [v.live, *controls.values()]
    ctx.answers["quant.button"] = ShowMeAnswer(inputs, v.analysis_outputs(), stored_analysis)
    clear_on_refusal(analysis_run.event(ctx, v.analyze_btn.click, inputs, v.analysis_outputs()), v.analysis_outputs())
    maps_run.event(ctx, [v.layer.release, v.head.release], [v.prompt, v.chat, v.layer, v.head], v.maps_outputs())
    gen_inputs = [v.prompt, v.chat, v.scheme, v.fmt, v.key_axis, v.value_axis, v.group, v.window, v.max_new]
    generated = generate_run.event(ctx, v.gen_btn.click, [*gen_inputs, v.history], v.generated_outputs())
    clear_on_refusal(generated, [v.gen_summary, v.full_text, v.quant_text, v.tokens])  # the agreement history stays
    ctx.examples["tab_quant"] = (
        Example(
            what="the needle passage's real keys and values, KIVI's 2-bit scheme beside every other",
            change="paste your own prompt or change the scheme and press **Analyze this prompt**",
            key=once(lambda: plan(KIVI.values)),
            draw=lambda value, entry, request: v.analysis(value),
            outputs=v.analysis_outputs(),
            values={c: KIVI.values[k] for k, c in controls.items() if k in KIVI.values},
        ),
        v.example,
    )
