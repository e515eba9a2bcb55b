"""Quantization tab: outlier key channels, every scheme's error and bytes, and generation on a quantized cache."""

from __future__ import annotations

from collections.abc import Callable

import gradio as gr

from kvviz.capture.model_io import encode_prompt
from kvviz.examples import needle_prompt
from kvviz.figures import quant as fig
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
from kvviz.quant.schemes import AXES, FORMATS, QuantSpec, Scheme, preset_schemes, rotation_schemes
from kvviz.safety import whole_number
from kvviz.ui.page.widgets import captioned_plot, clear_on_refusal, waiting_table
from kvviz.ui.serving.context import AppContext, ShowMeAnswer
from kvviz.ui.serving.jobs import UserError
from kvviz.ui.serving.model_job import ModelJob, Size, prompt_ids
from kvviz.ui.serving.precompute import live_box, shared
from kvviz.ui.serving.sessions import user_errors
from kvviz.units import format_bytes

GROUPS = [16, 32, 64]
MAX_PROMPT = 1024  # tokens analysed (Q, K, V of every layer are held in memory for the view)
CUSTOM = "Your scheme (the controls above)"
WHY = (
    "**Why this decides the grouping.** A scale must stretch to cover the largest value in its group. Per token, "
    "an outlier channel sits in every token's group and leaves the ordinary channels only a level or two at 2 bits; "
    "per channel, the outlier gets its own scale and the others keep theirs (KIVI). Values have no such channels, "
    "and each attention output mixes value *rows*, so values are grouped per token."
)


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
):
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
    return (
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


def maps(ctx: AppContext, prompt, chat, layer, head):
    """Only the two magnitude maps (layer or head changed)."""
    qkv = _qkv(ctx, prompt, chat)
    layer, head = int(layer), int(head)
    with user_errors():
        kmap, vmap = magnitude_map(qkv, layer, head, "k"), magnitude_map(qkv, layer, head, "v")
        rmap = magnitude_map(qkv, layer, head, "k", rotate=True)
    return (
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
):
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
    return (cmp.full_text, cmp.quant_text, summary, fig.side_by_side_frame(cmp), fig.agreement_bars(history), history)


def build(ctx: AppContext) -> None:
    """Build the Quantization tab inside the caller's ``gr.Tab``.

    Length: long because it lays the tab's widgets out in page order and wires each once; its model work is declared
    as :class:`~kvviz.ui.serving.model_job.ModelJob` declarations (validate → call kvviz → format)."""
    info = ctx.info
    gr.Markdown(
        "Quantize the cache of the real model and see what breaks. Keys have a few **outlier channels** "
        "that are large for every token; that is why KIVI gives keys a scale per channel and values a scale "
        "per token. Errors are measured on this prompt's own queries, keys and values (simulated "
        "quantization: each entry is quantized and dequantized; bytes count a packed store)."
    )
    with gr.Row():
        with gr.Column(scale=3):
            prompt = gr.Textbox(label="Prompt", lines=4, value=needle_prompt(), elem_id="quant-prompt")
            chat = gr.Checkbox(value=True, label="Use the chat template")
        with gr.Column(scale=2):
            layer = gr.Slider(
                0, info.layers - 1, value=min(info.layers - 1, 15), step=1, label="Layer", elem_id="quant-layer"
            )
            head = gr.Slider(0, info.kv_heads - 1, value=0, step=1, label="KV head", elem_id="quant-head")
    with gr.Row():
        fmt = gr.Dropdown(list(FORMATS), value="int2", label="Format", elem_id="quant-format")
        key_axis = gr.Dropdown(list(AXES), value="channel", label="Keys grouped per", elem_id="quant-key-axis")
        value_axis = gr.Dropdown(list(AXES), value="token", label="Values grouped per", elem_id="quant-value-axis")
        group = gr.Dropdown(GROUPS, value=32, label="Group size (channels or tokens)", elem_id="quant-group")
        window = gr.Slider(
            0, 128, value=32, step=1, label="Recent tokens kept in full precision", elem_id="quant-window"
        )
    with gr.Row():
        analyze_btn = gr.Button("Analyze this prompt", variant="primary", elem_id="quant-analyze", scale=3)
        live = live_box("quant-live")
    with gr.Row():
        kplot = captioned_plot("|keys|", "quant-keys", fig.CAPTIONS["keys"])
        vplot = captioned_plot("|values|", "quant-values", fig.CAPTIONS["values"])
    maps_md = gr.Markdown(elem_id="quant-maps-text")
    headline = gr.Markdown(elem_id="quant-headline")
    table = gr.Dataframe(
        waiting_table("Press Analyze this prompt to see every scheme's error and size"),
        label="Every scheme on this prompt",
        interactive=False,
        wrap=True,  # with widths that add up to the box: every column on screen, long groupings on two lines
        column_widths=["19%", "8%", "8%", "9%", "7%", "10%", "11%", "14%", "14%"],
        elem_id="quant-table",
    )
    errors = gr.Plot(label="Error per scheme", elem_id="quant-errors")
    gr.Markdown(fig.CAPTIONS["errors"], elem_classes="caption")
    with gr.Row():
        sizes = captioned_plot("Bytes per scheme", "quant-bytes", fig.CAPTIONS["bytes"])
        layers_plot = captioned_plot("Error per layer", "quant-layers", fig.CAPTIONS["layers"])
    gr.Markdown("### Rotation beside KIVI: a Hadamard turn per head before per-token groups")
    with gr.Row():
        rplot = captioned_plot("|keys| after the rotation", "quant-rotated", fig.CAPTIONS["rotated"])
        rbars = captioned_plot("Rotation vs KIVI vs per token", "quant-rotation", fig.CAPTIONS["rotation"])
    rot_md = gr.Markdown(elem_id="quant-rotation-text")

    gr.Markdown(
        "### Generate with a cache that quantizes as it stores (the Hadamard schemes store rotated keys, turned back on read)"
    )
    names = [s.name for s in preset_schemes() + rotation_schemes()] + [CUSTOM]
    with gr.Row():
        scheme = gr.Dropdown(names, value=CUSTOM, label="Scheme", elem_id="quant-scheme")
        max_new = gr.Slider(
            1,
            min(64, ctx.settings.max_new_tokens),
            value=min(24, ctx.settings.max_new_tokens),
            step=1,
            label="Max new tokens",
            elem_id="quant-max-new",
        )
        gen_btn = gr.Button("Generate: full vs quantized", variant="primary", elem_id="quant-generate")
    gen_md = gr.Markdown(elem_id="quant-gen-summary")
    with gr.Row():
        full_text = gr.Textbox(label="Full-precision cache", lines=4, elem_id="quant-full-text")
        quant_text = gr.Textbox(label="Quantized cache", lines=4, elem_id="quant-quant-text")
    tokens = gr.Dataframe(
        waiting_table("Press Generate: full vs quantized to compare the tokens"),
        label="Token by token",
        interactive=False,
        elem_id="quant-tokens",
    )
    agreement = gr.Plot(label="Agreement", elem_id="quant-agreement")
    gr.Markdown(fig.CAPTIONS["agreement"], elem_classes="caption")
    history = gr.State([])

    ctx.components.update(
        {
            "quant.prompt": prompt,
            "quant.chat": chat,
            "quant.layer": layer,
            "quant.head": head,
            "quant.format": fmt,
            "quant.key_axis": key_axis,
            "quant.value_axis": value_axis,
            "quant.group": group,
            "quant.window": window,
            "quant.button": analyze_btn,
            "quant.scheme": scheme,
            "quant.max_new": max_new,
            "quant.generate": gen_btn,
        }
    )
    controls = [prompt, chat, layer, head, fmt, key_axis, value_axis, group, window]
    control_keys = [
        "quant.prompt",
        "quant.chat",
        "quant.layer",
        "quant.head",
        "quant.format",
        "quant.key_axis",
        "quant.value_axis",
        "quant.group",
        "quant.window",
    ]

    def analysis_job(values) -> tuple[tuple, Callable]:
        """The store key and computation of one analysis (the prompt checked and tokenized first)."""
        n = len(_qkv_ids(ctx, values[0], values[1]))

        def compute(report, should_stop):
            return analyze(ctx, *values, progress=lambda f, desc="": report(f, desc))

        return (ctx.lm.name, "quant", n, *[_same(v) for v in values]), compute

    def plan(values: dict) -> tuple:
        key, compute = analysis_job([values.get(k, c.value) for k, c in zip(control_keys, controls)])
        ctx.store.plan(key, "quantization analysis", compute)
        return key

    ctx.planners["quant.button"] = plan

    def run_analyze(job):
        live, key, compute = job.req
        return shared(job, key, compute, live=live)[0]

    def run_maps(job):
        return maps(ctx, *job.req[0])

    def run_generate(job):
        return generate(ctx, *job.req[0], progress=job.progress)

    def gen_request(_ctx, *values):
        n_new = _max_new(ctx, values[8])
        return values, len(prompt_ids(ctx, values[0], values[1], n_new)[1]), n_new

    analysis_run = ModelJob(
        "quantization analysis",
        check=lambda _ctx, live, *settings: (bool(live), *analysis_job(settings)),
        run=run_analyze,
        size=lambda r: Size(r[1][2], 0),
        store=True,
        progress=True,
    )
    maps_run = ModelJob(
        "key/value maps",
        check=lambda _ctx, *values: (values, len(prompt_ids(ctx, values[0], values[1])[1])),
        run=run_maps,
        size=lambda r: Size(r[1], 0),
    )
    generate_run = ModelJob(
        "quantized generation",
        check=gen_request,
        run=run_generate,
        size=lambda r: Size(r[1], r[2], runs=2),
        progress=True,
    )

    analysis = [headline, kplot, vplot, maps_md, table, errors, sizes, layers_plot, rplot, rbars, rot_md]
    analysis_outputs = [kplot, vplot, maps_md, headline, table, errors, sizes, layers_plot, rplot, rbars, rot_md]

    def stored_analysis(request: gr.Request, live, *settings):
        """The analysis's outputs when its result is stored (for a show-me), else None."""
        entry = ctx.store.entry(analysis_job(settings)[0])
        return entry.value if entry is not None and entry.state == "done" else None

    ctx.answers["quant.button"] = ShowMeAnswer([live, *controls], analysis_outputs, stored_analysis)
    clear_on_refusal(analysis_run.event(ctx, analyze_btn.click, [live, *controls], analysis_outputs), analysis)
    maps_run.event(ctx, [layer.release, head.release], [prompt, chat, layer, head], [kplot, vplot, maps_md, rplot])
    generated = generate_run.event(
        ctx,
        gen_btn.click,
        [prompt, chat, scheme, fmt, key_axis, value_axis, group, window, max_new, history],
        [full_text, quant_text, gen_md, tokens, agreement, history],
    )
    clear_on_refusal(generated, [gen_md, full_text, quant_text, tokens])  # the session's agreement history stays
