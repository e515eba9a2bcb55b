"""Eviction tab section: Compose — the policy's kept entries stored under a quantization scheme.

The chapter's fixes for a cache that does not fit, measured together on the tab's prompt and policy:
:func:`kvviz.eviction.compose.compose` runs the full cache, the policy, the quantization and both;
the table comes from :mod:`kvviz.figures.eviction_compare`. One job through the gate for all seven runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import gradio as gr

from kvviz.eviction.compose import compose
from kvviz.eviction.compose import schemes as compose_schemes
from kvviz.eviction.run import EvictionRequest
from kvviz.figures import eviction_compare as fig
from kvviz.ui.page.widgets import waiting_table
from kvviz.ui.serving.context import AppContext
from kvviz.ui.serving.job import Size
from kvviz.ui.serving.jobs import UserError
from kvviz.ui.serving.model_job import ModelJob

RUNS = 7  # the full cache, then the policy, the quantization and both, each teacher-forced and free
POLICY_RUNS = 4  # of those, the runs that make the policy's own passes (KVzip's repeat of the context)


@dataclass
class ComposeSection:
    """The section's controls, laid out where the tab places them and wired once its inputs exist."""

    scheme: gr.Dropdown
    button: gr.Button
    table: gr.Dataframe


@dataclass(frozen=True)
class ComposeAsk:
    """A checked composition: the quantization's name and the tab's eviction request."""

    scheme: str
    req: EvictionRequest


def layout() -> ComposeSection:
    """The heading, the scheme picker, the button and the table (inside the caller's Blocks)."""
    gr.Markdown("### Compose: the policy's kept entries, quantized")
    with gr.Row():
        scheme = gr.Dropdown(
            list(compose_schemes()),
            value="KIVI-4",
            label="Quantization of what the policy keeps",
            elem_id="evict-scheme",
        )
        button = gr.Button("Compose", elem_id="evict-compose")
    table = gr.Dataframe(
        waiting_table("Press Compose to see bytes and answers side by side"),
        label="Full cache · policy · quantization · both",
        elem_id="evict-compose-table",
        wrap=True,
    )
    gr.Markdown(fig.CAPTIONS["compose"], elem_classes="caption")
    return ComposeSection(scheme, button, table)


def wire(ctx: AppContext, section: ComposeSection, main_inputs: list, gather: Callable[..., EvictionRequest]) -> None:
    """Check (admitted at once, or refused) then run through the gate, as the tab's other buttons do."""

    def compose_request(_ctx, name, *args) -> ComposeAsk:
        if name not in compose_schemes():
            raise UserError(f"Pick a quantization: {', '.join(compose_schemes())}.")
        return ComposeAsk(name, gather(*args))

    def run_compose(job) -> dict:
        a: ComposeAsk = job.req
        req = a.req
        comp = compose(
            ctx.lm,
            req.ids,
            req.policy,
            compose_schemes()[a.scheme],
            budget=req.budget,
            ratio=req.ratio,
            n_compress=req.n_compress,
            max_new_tokens=req.max_new_tokens,
            should_stop=job.cancel,
            progress=job.progress,
        )
        return {section.table: fig.composition_table(comp)}

    composition = ModelJob(
        "composition",
        check=compose_request,
        run=run_compose,
        size=lambda a: Size(
            len(a.req.ids), a.req.max_new_tokens, runs=RUNS, repeat_passes=a.req.repeat_passes * POLICY_RUNS
        ),
        progress=True,
    )
    inputs = [section.scheme, *main_inputs]
    composition.button(ctx, section.button, inputs, [section.table])
