"""The Quantization tab's components, declared once by name (:class:`QuantViews`), and their layout in page order.

:mod:`kvviz.ui.quant` wires them: every handler returns ``{component: value}`` through the ``analysis``, ``maps``
and ``generated`` methods here, so nothing downstream knows an output's position.
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from kvviz.examples import needle_prompt
from kvviz.figures import quant as fig
from kvviz.quant.schemes import AXES, FORMATS
from kvviz.ui.page.widgets import captioned_plot, waiting_table
from kvviz.ui.serving.context import AppContext
from kvviz.ui.serving.precompute import live_box

GROUPS = [16, 32, 64]
CUSTOM = "Your scheme (the controls above)"


@dataclass
class QuantViews:
    """Every component of the tab, by name."""

    prompt: gr.Textbox
    chat: gr.Checkbox
    layer: gr.Slider
    head: gr.Slider
    fmt: gr.Dropdown
    key_axis: gr.Dropdown
    value_axis: gr.Dropdown
    group: gr.Dropdown
    window: gr.Slider
    analyze_btn: gr.Button
    live: gr.Checkbox
    kplot: gr.Plot
    vplot: gr.Plot
    example: gr.Markdown
    maps_text: gr.Markdown
    headline: gr.Markdown
    table: gr.Dataframe
    errors: gr.Plot
    sizes: gr.Plot
    layers: gr.Plot
    rplot: gr.Plot
    rbars: gr.Plot
    rotation_text: gr.Markdown
    scheme: gr.Dropdown
    max_new: gr.Slider
    gen_btn: gr.Button
    gen_summary: gr.Markdown
    full_text: gr.Textbox
    quant_text: gr.Textbox
    tokens: gr.Dataframe
    agreement: gr.Plot
    history: gr.State

    def controls(self) -> dict[str, gr.components.Component]:
        """The analysis's settings by their show-me names, in the order ``analyze`` takes them."""
        names = ["prompt", "chat", "layer", "head", "format", "key_axis", "value_axis", "group", "window"]
        comps = [self.prompt, self.chat, self.layer, self.head, self.fmt, self.key_axis, self.value_axis]
        return dict(zip([f"quant.{n}" for n in names], [*comps, self.group, self.window]))

    def analysis(self, a) -> dict:
        """An :class:`~kvviz.ui.quant.Analysis` in the views."""
        return {
            self.kplot: a.kmap,
            self.vplot: a.vmap,
            self.maps_text: a.maps_text,
            self.headline: a.headline,
            self.table: a.table,
            self.errors: a.errors,
            self.sizes: a.sizes,
            self.layers: a.layers,
            self.rplot: a.rmap,
            self.rbars: a.rbars,
            self.rotation_text: a.rotation_text,
        }

    def analysis_outputs(self) -> list:
        """What an analysis sets, the headline first (a refused request's note goes there)."""
        return [self.headline, *[c for c in self.analysis(_Blank()) if c is not self.headline]]

    def maps(self, m) -> dict:
        """A :class:`~kvviz.ui.quant.Maps` in the views."""
        return {self.kplot: m.kmap, self.vplot: m.vmap, self.maps_text: m.text, self.rplot: m.rmap}

    def maps_outputs(self) -> list:
        return [self.kplot, self.vplot, self.maps_text, self.rplot]

    def generated(self, g) -> dict:
        """A :class:`~kvviz.ui.quant.Generated` in the views."""
        return {
            self.full_text: g.full_text,
            self.quant_text: g.quant_text,
            self.gen_summary: g.summary,
            self.tokens: g.tokens,
            self.agreement: g.agreement,
            self.history: g.history,
        }

    def generated_outputs(self) -> list:
        return [self.full_text, self.quant_text, self.gen_summary, self.tokens, self.agreement, self.history]


class _Blank:
    """Stands in for a result when only the components are wanted."""

    def __getattr__(self, name: str) -> None:
        return None


def layout(ctx: AppContext, scheme_names: list[str]) -> QuantViews:
    """The tab's components in page order (``scheme_names``: the generation's scheme choices)."""
    info = ctx.info
    gr.Markdown(
        "Quantize the cache of the real model and see what breaks. Keys have a few **outlier channels** "
        "that are large for every token; that is why KIVI gives keys a scale per channel and values a scale "
        "per token. Errors are measured on this prompt's own queries, keys and values (simulated "
        "quantization: each entry is quantized and dequantized; bytes count a packed store)."
    )
    c: dict = {}
    with gr.Row():
        with gr.Column(scale=3):
            c["prompt"] = gr.Textbox(label="Prompt", lines=4, value=needle_prompt(), elem_id="quant-prompt")
            c["chat"] = gr.Checkbox(value=True, label="Use the chat template")
        with gr.Column(scale=2):
            c["layer"] = gr.Slider(
                0, info.layers - 1, value=min(info.layers - 1, 15), step=1, label="Layer", elem_id="quant-layer"
            )
            c["head"] = gr.Slider(0, info.kv_heads - 1, value=0, step=1, label="KV head", elem_id="quant-head")
    with gr.Row():
        c["fmt"] = gr.Dropdown(list(FORMATS), value="int2", label="Format", elem_id="quant-format")
        c["key_axis"] = gr.Dropdown(list(AXES), value="channel", label="Keys grouped per", elem_id="quant-key-axis")
        c["value_axis"] = gr.Dropdown(list(AXES), value="token", label="Values grouped per", elem_id="quant-value-axis")
        c["group"] = gr.Dropdown(GROUPS, value=32, label="Group size (channels or tokens)", elem_id="quant-group")
        c["window"] = gr.Slider(
            0, 128, value=32, step=1, label="Recent tokens kept in full precision", elem_id="quant-window"
        )
    with gr.Row():
        c["analyze_btn"] = gr.Button("Analyze this prompt", variant="primary", elem_id="quant-analyze", scale=3)
        c["live"] = live_box("quant-live")
    c["example"] = gr.Markdown(elem_id="quant-example")
    with gr.Row():
        c["kplot"] = captioned_plot("|keys|", "quant-keys", fig.CAPTIONS["keys"])
        c["vplot"] = captioned_plot("|values|", "quant-values", fig.CAPTIONS["values"])
    c["maps_text"] = gr.Markdown(elem_id="quant-maps-text")
    c["headline"] = gr.Markdown(elem_id="quant-headline")
    c["table"] = gr.Dataframe(
        waiting_table("Press Analyze this prompt to see every scheme's error and size"),
        label="Every scheme on this prompt",
        interactive=False,
        wrap=True,  # with widths that add up to the box: every column on screen, long groupings on two lines
        column_widths=["19%", "8%", "8%", "9%", "7%", "10%", "11%", "14%", "14%"],
        elem_id="quant-table",
    )
    c["errors"] = gr.Plot(label="Error per scheme", elem_id="quant-errors")
    gr.Markdown(fig.CAPTIONS["errors"], elem_classes="caption")
    with gr.Row():
        c["sizes"] = captioned_plot("Bytes per scheme", "quant-bytes", fig.CAPTIONS["bytes"])
        c["layers"] = captioned_plot("Error per layer", "quant-layers", fig.CAPTIONS["layers"])
    gr.Markdown("### Rotation beside KIVI: a Hadamard turn per head before per-token groups")
    with gr.Row():
        c["rplot"] = captioned_plot("|keys| after the rotation", "quant-rotated", fig.CAPTIONS["rotated"])
        c["rbars"] = captioned_plot("Rotation vs KIVI vs per token", "quant-rotation", fig.CAPTIONS["rotation"])
    c["rotation_text"] = gr.Markdown(elem_id="quant-rotation-text")
    _generation(ctx, c, scheme_names)
    return QuantViews(**c)


def _generation(ctx: AppContext, c: dict, scheme_names: list[str]) -> None:
    """The generation section: a cache that quantizes as it stores, beside the full one."""
    gr.Markdown(
        "### Generate with a cache that quantizes as it stores (the Hadamard schemes store rotated keys, turned back on read)"
    )
    with gr.Row():
        c["scheme"] = gr.Dropdown(scheme_names, value=CUSTOM, label="Scheme", elem_id="quant-scheme")
        c["max_new"] = gr.Slider(
            1,
            min(64, ctx.settings.max_new_tokens),
            value=min(24, ctx.settings.max_new_tokens),
            step=1,
            label="Max new tokens",
            elem_id="quant-max-new",
        )
        c["gen_btn"] = gr.Button("Generate: full vs quantized", variant="primary", elem_id="quant-generate")
    c["gen_summary"] = gr.Markdown(elem_id="quant-gen-summary")
    with gr.Row():
        c["full_text"] = gr.Textbox(label="Full-precision cache", lines=4, elem_id="quant-full-text")
        c["quant_text"] = gr.Textbox(label="Quantized cache", lines=4, elem_id="quant-quant-text")
    c["tokens"] = gr.Dataframe(
        waiting_table("Press Generate: full vs quantized to compare the tokens"),
        label="Token by token",
        interactive=False,
        elem_id="quant-tokens",
    )
    c["agreement"] = gr.Plot(label="Agreement", elem_id="quant-agreement")
    gr.Markdown(fig.CAPTIONS["agreement"], elem_classes="caption")
    c["history"] = gr.State([])
