"""Eviction tab: what each registered policy keeps per layer and KV head, and what that does to the answer.

Handlers check raw widget values (``gr.Error`` says what to fix), call :mod:`kvviz.eviction.run`,
:mod:`kvviz.eviction.compare` and :mod:`kvviz.eviction.demos`, and draw with
:mod:`kvviz.figures.eviction`; no tensor math here. The tab's sections live beside it: the checked request
and views in :mod:`kvviz.ui.eviction.request`, the side-by-side comparison in :mod:`kvviz.ui.eviction.compare`,
Compose in :mod:`kvviz.ui.eviction.compose`, the demos in :mod:`kvviz.ui.eviction.demos`. The named endpoint ``/evict`` returns the same
dict as ``python -m kvviz evict --json``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import gradio as gr

from kvviz.eviction.demos import NEEDLE_BUDGET, NEEDLE_FILLER
from kvviz.eviction.policies import POLICIES, field_specs
from kvviz.examples import NEEDLE_QUESTION, needle_passage
from kvviz.figures import eviction as fig
from kvviz.ui.eviction import compare as eviction_compare
from kvviz.ui.eviction import compose as eviction_compose
from kvviz.ui.eviction import demos as eviction_demos
from kvviz.ui.eviction.request import (  # noqa: F401  (re-exported: the tab's request, texts and views, where tests find them)
    BUDGET_MODES,
    COMPRESS,
    COMPRESS_CONTEXT,
    COMPRESS_QUESTION,
    EMPTY,
    RunViews,
    api_evict,
    check_request,
    compress_choices,
    library_call,
    policy_text,
    request_size,
    status_text,
    views,
)
from kvviz.ui.page.play import play_button
from kvviz.ui.page.widgets import captioned_plot, clear_on_refusal, waiting_table
from kvviz.ui.serving.context import AppContext
from kvviz.ui.serving.model_job import ModelJob


@dataclass
class _Form:
    """The run's form and its result lines, by name."""

    prompt: gr.Textbox
    question: gr.Textbox
    chat: gr.Checkbox
    compress: gr.Radio
    policy: gr.Dropdown
    mode: gr.Radio
    budget: gr.Number
    ratio: gr.Number
    max_new: gr.Number
    about: gr.Markdown
    params: dict  # "<policy>.<field>" → its control
    groups: dict  # policy → its group of controls (only the chosen policy's is visible)
    run_btn: gr.Button
    example: gr.Markdown
    status: gr.Markdown
    answer: gr.Textbox
    run_state: gr.State

    def inputs(self) -> list:
        """What a run, a comparison and Compose read, in the order ``check_request`` takes them."""
        fixed = [self.prompt, self.question, self.chat, self.policy, self.mode, self.budget, self.ratio]
        return [*fixed, self.max_new, self.compress, *self.params.values()]


def build(ctx: AppContext) -> None:
    """Build the tab inside the caller's ``gr.Tab``: the layout of its form, views and sections, then the wiring."""
    form = _form(ctx)
    shown = _views(ctx.info)
    comparison, composition, demos = eviction_compare.layout(), eviction_compose.layout(), eviction_demos.layout()
    _wire(ctx, form, shown, comparison, composition, demos)


def _form(ctx: AppContext) -> _Form:
    info = ctx.info
    gr.Markdown(
        "Which cache entries each policy keeps, per layer and KV head, and what dropping the rest does to the "
        f"answer. The cache is stored per KV head ({info.kv_heads} per layer here, each shared by "
        f"{info.group_size} query heads), so score-based policies **average their scores over the query heads of "
        "each KV group**. The generation below really drops the entries: the cache tensors shrink."
    )
    c: dict = {}
    with gr.Row():
        with gr.Column(scale=3):
            c["prompt"] = gr.Textbox(
                label="Context (compressed)", lines=6, elem_id="evict-prompt", value=needle_passage(*NEEDLE_FILLER)
            )
            c["question"] = gr.Textbox(
                label="Question (appended after a blank line; optional)",
                lines=1,
                elem_id="evict-question",
                value=f"Question: {NEEDLE_QUESTION}",
            )
            c["chat"] = gr.Checkbox(True, label="Use the chat template", elem_id="evict-chat")
            c["compress"] = gr.Radio(
                COMPRESS,
                value=COMPRESS_QUESTION,
                label="What is compressed after the prefill",
                elem_id="evict-compress",
            )
        with gr.Column(scale=2):
            c["policy"] = gr.Dropdown(
                [(cls.title, name) for name, cls in POLICIES.items()],
                value="snapkv",
                label="Policy",
                elem_id="evict-policy",
            )
            c["mode"] = gr.Radio(BUDGET_MODES, value="tokens", label="Budget as", elem_id="evict-mode")
            c["budget"] = gr.Number(
                NEEDLE_BUDGET, precision=0, label="Budget: tokens kept per layer and KV head", elem_id="evict-budget"
            )
            # plain number boxes: a slider would clamp −0.2 to 0 silently; the handler refuses it by name
            c["ratio"] = gr.Number(
                0.5, label="Compression ratio r (fraction evicted, 0 to 0.99)", elem_id="evict-ratio", visible=False
            )
            c["max_new"] = gr.Number(
                16,
                precision=0,
                label=f"Max new tokens (1 to {min(128, ctx.settings.max_new_tokens)})",
                elem_id="evict-max-new",
            )
            c["about"] = gr.Markdown(policy_text("snapkv"), elem_id="evict-policy-about")
            c["params"], c["groups"] = _policy_params()
            c["run_btn"] = gr.Button("Run policy", variant="primary", elem_id="evict-run")
    c["example"] = gr.Markdown(elem_id="evict-example")
    c["status"] = gr.Markdown(EMPTY, elem_id="evict-status")
    c["answer"] = gr.Textbox(label="Answer under the policy", lines=2, elem_id="evict-answer")
    c["run_state"] = gr.State(None)
    return _Form(**c)


def _wire(ctx: AppContext, f: _Form, v: _Views, comparison, composition, demos) -> None:
    """Register the inputs other tabs set; wire the run, the pickers, the policy and budget switches and the sections."""
    names = ["prompt", "question", "chat", "policy", "mode", "budget", "ratio", "compress", "max_new"]
    ctx.components.update({f"eviction.{n}": getattr(f, n) for n in names})
    ctx.components.update({"eviction.run": f.run_btn, "eviction.layer": v.layer, "eviction.head": v.head})
    ctx.components.update({"eviction.step": v.step, "eviction.needle": demos.needle, "eviction.sinks": demos.sinks})
    ctx.components.update({"eviction.compare": comparison.button, "eviction.compare_policies": comparison.chosen})
    keys = list(f.params)

    def gather(context, q, use_chat, name, md, b, r, n_new, comp, *pvals):
        values = {k.split(".", 1)[1]: val for k, val in zip(keys, pvals) if k.startswith(f"{name}.")}
        return check_request(ctx, context, q, use_chat, name, md, b, r, n_new, values, comp)

    def show_run(result, policy) -> dict:
        """One policy run in the tab: its state, status, answer, the step slider and the views at step 0."""
        slider = gr.Slider(minimum=0, maximum=max(1, len(result.history) - 1), value=0)
        shown = v.run_views(views(result, ctx.info.layers - 1, 0, 0, policy.score_label))
        told = {f.run_state: result, f.status: status_text(result, policy), f.answer: result.text}
        return {**told, v.step: slider, **shown}

    def run(job) -> dict:
        result = job.req.run(ctx.lm, should_stop=job.cancel)
        budgets = {v.budget_plot: fig.budget_map(result), v.budget_table: fig.budget_bytes(result)}
        return {**show_run(result, job.req.policy), **budgets}

    policy_run = ModelJob("eviction run", check=lambda _ctx, *args: gather(*args), run=run, size=request_size)
    run_outputs = [f.run_state, f.status, f.answer, v.step, *v.view_outputs(), v.budget_plot, v.budget_table]
    checked, ran = policy_run.button(ctx, f.run_btn, f.inputs(), run_outputs)
    for event in (checked, ran):
        clear_on_refusal(event, [f.status, f.run_state, f.answer, *v.view_outputs()])

    def redraw(result, lyr, hd, st) -> dict:
        label = POLICIES[result.policy].score_label if result is not None else ""
        return v.run_views(views(result, lyr, hd, st, label)) or gr.skip()  # no run: nothing to redraw

    for control in (v.layer, v.head, v.step):
        pickers = [f.run_state, v.layer, v.head, v.step]
        control.change(redraw, pickers, v.view_outputs(), api_name=False, show_progress="hidden")
    f.policy.change(
        lambda n: {
            **{g: gr.Group(visible=n == name) for name, g in f.groups.items()},
            f.about: policy_text(n),
            f.compress: gr.Radio(compress_choices(n)),
        },
        f.policy,
        [*f.groups.values(), f.about, f.compress],
        api_name=False,
        queue=False,
    )
    f.mode.change(
        lambda m: {f.budget: gr.Number(visible=m == "tokens"), f.ratio: gr.Number(visible=m == "ratio")},
        f.mode,
        [f.budget, f.ratio],
        api_name=False,
        queue=False,
    )
    eviction_compare.wire(ctx, comparison, f.inputs(), gather)
    eviction_compose.wire(ctx, composition, f.inputs(), gather)
    form = {k: getattr(f, k) for k in ("prompt", "question", "chat", "policy", "mode", "budget")}
    shown = [*form.values(), f.run_state, f.status, f.answer, v.step, *v.view_outputs()]
    needle = eviction_demos.NeedleTargets(form, show_run, shown)
    eviction_demos.wire(ctx, demos, f.compress, needle, comparison, f.example)
    api_evict.api(ctx, api_name="evict")


def _policy_params() -> tuple[dict, dict]:
    """One group of parameter controls per policy, from its field specs (only the chosen policy's is visible):
    the controls by "<policy>.<field>", and the groups by policy."""
    param_boxes, groups = {}, {}
    for name, cls in POLICIES.items():
        specs = field_specs(cls)
        with gr.Group(visible=name == "snapkv") as groups[name]:
            if specs:
                gr.Markdown(f"**{cls.title}** parameters")
            for s in specs:
                key = f"{name}.{s['name']}"
                label = f"{s['name'].replace('_', ' ')} — {s['help']}"
                if s["type"] == "bool":
                    param_boxes[key] = gr.Checkbox(s["default"], label=label)
                elif s["choices"]:
                    param_boxes[key] = gr.Radio(s["choices"], value=s["default"], label=label)
                elif s["type"] == "float":
                    param_boxes[key] = gr.Slider(s["min"], s["max"], value=s["default"], step=0.05, label=label)
                else:
                    param_boxes[key] = gr.Number(
                        s["default"], precision=0, label=label, minimum=s["min"], maximum=s["max"]
                    )
    return param_boxes, groups


@dataclass
class _Views:
    """The run's views: layer, KV head and step pickers, the token strip, three charts and two tables."""

    layer: gr.Slider
    head: gr.Dropdown
    step: gr.Slider
    strip: gr.HighlightedText
    kept_plot: gr.Plot
    time_plot: gr.Plot
    score_plot: gr.Plot
    budget_plot: gr.Plot
    budget_table: gr.Dataframe
    slots: gr.Dataframe

    def view_outputs(self) -> list:
        """What ``views`` draws (the strip, three charts and the slot table)."""
        return [self.strip, self.kept_plot, self.time_plot, self.score_plot, self.slots]

    def run_views(self, drawn: RunViews | None) -> dict:
        """``views``' five results, each into the view of its name (nothing without a run)."""
        if drawn is None:
            return {}
        return {getattr(self, f.name): getattr(drawn, f.name) for f in fields(drawn)}


def _views(info) -> _Views:
    with gr.Row():
        layer = gr.Slider(0, info.layers - 1, value=info.layers - 1, step=1, label="Layer", elem_id="evict-layer")
        head = gr.Dropdown(
            [
                (f"KV head {h} (query heads {h * info.group_size}–{(h + 1) * info.group_size - 1})", h)
                for h in range(info.kv_heads)
            ],
            value=0,
            label="KV head",
            elem_id="evict-head",
        )
        step = gr.Slider(
            0, 1, value=0, step=1, label="Step (0 = after the prefill, then one per fed token)", elem_id="evict-step"
        )
        play_button(step, "evict-play")
    strip = gr.HighlightedText(
        label="Tokens: kept / evicted / sink / window / heavy hitter",
        elem_id="evict-strip",
        color_map=fig.ROLE_COLORS,
        combine_adjacent=False,
        show_legend=True,
        show_inline_category=False,
    )
    gr.Markdown(fig.CAPTIONS["strip"], elem_classes="caption")
    kept_plot = gr.Plot(label="Layers × positions", elem_id="evict-map")
    gr.Markdown(fig.CAPTIONS["map"], elem_classes="caption")
    time_plot = gr.Plot(label="Over decode steps", elem_id="evict-timeline")
    gr.Markdown(fig.CAPTIONS["timeline"], elem_classes="caption")
    score_plot = gr.Plot(label="Scores behind the choice", elem_id="evict-scores")
    gr.Markdown(fig.CAPTIONS["scores"], elem_classes="caption")
    with gr.Row():
        budget_plot = captioned_plot("Budget per layer and KV head", "evict-budgets", fig.CAPTIONS["budgets"])
        with gr.Column():
            budget_table = gr.Dataframe(
                waiting_table("Press Run policy to see the bytes each store holds for the kept set"),
                label="What the kept set costs",
                elem_id="evict-budget-bytes",
            )
            gr.Markdown(fig.CAPTIONS["budget_bytes"], elem_classes="caption")
    slots = gr.Dataframe(
        waiting_table("Press Run policy to see the chosen KV head's cache, slot by slot"),
        label="The chosen KV head's cache: slot, original position, RoPE position",
        elem_id="evict-slots",
        max_height=260,
    )
    gr.Markdown(
        "Each row is one held entry: its slot in the cache tensor, the token's original position, and the "
        "position its key is rotated with (the status line above says which mode is in force).",
        elem_classes="caption",
    )

    return _Views(layer, head, step, strip, kept_plot, time_plot, score_plot, budget_plot, budget_table, slots)
