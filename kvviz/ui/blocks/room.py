"""Blocks tab section: the engine's real prefix cache, live, as the room's Generate runs fill and reuse it.

Reads :meth:`kvviz.engine.prefix.PrefixStore.blocks` (a copy taken under the store's lock: no model
work, no tensors) every :data:`REFRESH_S` seconds while the Blocks tab is shown, and only redraws when
the cache changed; the figures come from :mod:`kvviz.figures.blocks_room`. No arithmetic here. In a
public deployment the viewer is the request's session: another session's prompt blocks come without
their text (:data:`HIDDEN` instead), since anyone can call this refresh with any session.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import gradio as gr
import pandas as pd
import plotly.graph_objects as go
from gradio.context import Context

from kvviz.engine.disk_demo import MEMORY_BLOCKS, ORDER, PROMPT_TOKENS, SpillDemo, spill_demo
from kvviz.engine.prefix import StoreView
from kvviz.figures import blocks_room as fig
from kvviz.figures import prefix_tiers
from kvviz.ui.blocks import events
from kvviz.ui.page.widgets import captioned_plot, waiting_table
from kvviz.ui.serving.context import AppContext, ShowMeAnswer
from kvviz.ui.serving.identity import session_of
from kvviz.ui.serving.job import Size
from kvviz.ui.serving.model_job import ModelJob
from kvviz.ui.serving.precompute import live_box, origin, shared
from kvviz.units import format_bytes

REFRESH_S = 2.0
EXPLAIN = (
    "Blocks the engine keeps from earlier requests: a new request whose prompt starts with the same tokens "
    "reuses their keys and values instead of recomputing them."
)
NO_STORE = "This model's runs cannot be packed, so the engine keeps no prefix cache for it."
HIDDEN = "🔒 another session's prompt"


def signature(view: StoreView | None) -> tuple:
    """What the section shows, in a form cheap to compare: unchanged → nothing is sent to the page."""
    if view is None:
        return ()
    blocks = tuple((b.block_hash, b.ref_count, b.hits) for b in view.blocks)
    return blocks, tuple(sorted(view.stats.items())), tuple(r.number for r in view.requests)


def decoder(ctx: AppContext) -> Callable[[tuple[int, ...]], str]:
    """Token ids → text, memoized: a cached block's text never changes, and every viewer asks for it."""
    tokenizer = ctx.lm.tokenizer

    @lru_cache(maxsize=4096)
    def decode(ids: tuple[int, ...]) -> str:
        return tokenizer.decode(list(ids))

    return decode


@dataclass(frozen=True)
class Room:
    """What the live section shows of the engine's store, by name, and its signature (what is on the page)."""

    summary: str
    tree: go.Figure | None
    table: pd.DataFrame | None
    sources: go.Figure | None
    sig: tuple


def refresh(ctx: AppContext, decode: Callable[[tuple[int, ...]], str], last, viewer: str | None = None) -> Room | None:
    """The store as the section shows it, or None when it is as shown (signature ``last``): nothing is sent.
    ``viewer``: the session asking (in a public deployment it reads only its own and shared blocks)."""
    store = ctx.engine.prefix
    view = None if store is None else store.blocks(viewer, private=ctx.settings.public)
    sig = signature(view)
    if sig == last:
        return None
    if view is None:
        return Room(NO_STORE, None, None, None, sig)
    texts = [HIDDEN if b.hidden else decode(b.token_ids) for b in view.blocks]
    sources = prefix_tiers.sources_bar(view.requests)
    bpt = ctx.info.kv_bytes_per_token
    return Room(fig.room_summary(view, bpt), fig.room_tree(view, texts), fig.room_table(view, texts, bpt), sources, sig)


def _enclosing_tabs() -> list[gr.Tab]:
    """The tabs the section is built in, innermost first (the Blocks tab's sub-tab, then the Blocks tab)."""
    tabs, block = [], Context.block
    while block is not None:
        if isinstance(block, gr.Tab):
            tabs.append(block)
        block = block.parent
    return tabs


def build(ctx: AppContext) -> None:
    """The section, inside the Blocks tab: the engine's store, live, then the disk tier shown on a small one."""
    _live(ctx)
    build_disk_demo(ctx)


def _live(ctx: AppContext) -> None:
    gr.Markdown(f"### The room's prefix cache, live\n{EXPLAIN}")
    summary = gr.Markdown("Open this tab to read the engine's prefix cache.", elem_id="room-summary")
    tree = captioned_plot("Cached blocks by prefix", "room-tree", fig.CAPTIONS["tree"])
    table = gr.Dataframe(
        waiting_table("Press Generate on the Generate tab: the prompt blocks the engine keeps appear here"),
        label="Cached blocks, next to evict first",
        interactive=False,
        elem_id="room-table",
        max_height=400,
    )
    gr.Markdown(fig.CAPTIONS["table"], elem_classes="caption")
    sources = captioned_plot("Where each request's prompt came from", "room-sources", prefix_tiers.CAPTIONS["sources"])
    shown = gr.State(None)  # the signature on the page
    decode = decoder(ctx)
    events.build(ctx, decode)

    def fresh(last, request: gr.Request) -> dict:
        # no session (a bare API call) is a session of its own: it reads only the server's and shared blocks
        room = refresh(ctx, decode, last, session_of(request))
        if room is None:
            return {}
        return {summary: room.summary, tree: room.tree, table: room.table, sources: room.sources, shown: room.sig}

    def tick(last, request: gr.Request):
        return fresh(last, request) or gr.skip()  # an empty dict is refused by Gradio: nothing new skips them all

    outputs = [summary, tree, table, sources, shown]
    tabs = _enclosing_tabs()
    timer = gr.Timer(REFRESH_S, active=not tabs or ctx.tabs is None)
    timer.tick(tick, shown, outputs, api_name=False, show_progress="hidden", queue=False)
    if not tabs or ctx.tabs is None:
        return

    def opened(last, request: gr.Request) -> dict:
        return {**fresh(last, request), timer: gr.Timer(active=True)}

    inner = tabs[0]
    # the sub-tab the inner bar shows (its first until the visitor picks another): opening the outer tab draws the
    # section (and starts its timer) only when this section is the sub-tab that opens with it, so the Blocks tab's
    # first open sends the live view alone, not this hidden section's charts as well
    picked = gr.State(next((t.label for t in inner.parent.children if isinstance(t, gr.Tab)), inner.label))

    def outer_picked(label: str):
        """The select handler of the bar ``label``'s tab is in: that tab opened with this section's sub-tab picked
        draws the section and starts its timer; any other pick stops the timer. One event on the bar, not one more
        on the tab: the page dispatches a tab's select events one after another, each with its own bookkeeping,
        and a second one here held up the Blocks tab's example by a few hundred milliseconds."""

        def handler(last, pick, evt: gr.SelectData, request: gr.Request) -> dict:
            if evt.value == label and pick == inner.label:
                return opened(last, request)
            return {timer: gr.Timer(active=False)}

        return handler

    inner.select(opened, shown, [*outputs, timer], api_name=False, show_progress="hidden", queue=False)
    inner.parent.select(
        _switched(inner.label), None, [timer, picked], api_name=False, show_progress="hidden", queue=False
    )
    for tab in tabs[1:]:
        bar = ctx.tabs if tab is tabs[-1] else tab.parent
        bar.select(
            outer_picked(tab.label),
            [shown, picked],
            [*outputs, timer],
            api_name=False,
            show_progress="hidden",
            queue=False,
        )


def _switched(label: str):
    """The inner tab bar's select handler: the timer runs while the tab called ``label`` is picked, and the pick is
    kept for the outer tab's next open."""

    timer_for = _shown_while(label)

    def switched(evt: gr.SelectData) -> tuple:
        return (timer_for(evt), evt.value)

    return switched


def _shown_while(label: str):
    """A tab bar's select handler: the timer runs while the tab called ``label`` is the one picked."""

    def switched(evt: gr.SelectData):
        return gr.Timer(active=evt.value == label)

    return switched


DISK = (
    "### The disk tier, shown\nWith the engine's store ({memory} in memory) a lecture evicts nothing, so "
    "nothing reaches its disk tier. This runs four requests through a store of its own whose memory holds one "
    "prompt's blocks, so you can watch blocks spill to disk and come back (the room's cache is not touched)."
)


def disk_key(ctx: AppContext) -> tuple:
    """The store key of the disk-tier demo (one result per model)."""
    return (ctx.lm.name, "disk-tier demo", PROMPT_TOKENS, MEMORY_BLOCKS)


@dataclass(frozen=True)
class DiskShown:
    """What the disk-tier demo shows: its summary, the per-request table and the sources chart."""

    summary: str
    table: pd.DataFrame
    chart: go.Figure


def disk_outputs(demo: SpillDemo, when: str) -> DiskShown:
    """Summary, per-request table and sources chart of the demo."""
    chart = prefix_tiers.sources_bar([s.sources for s in demo.steps])
    return DiskShown(f"{fig.disk_demo_summary(demo)} · *{when}*", fig.disk_demo_table(demo), chart)


def stored_disk(ctx: AppContext):
    """The disk-tier demo's stored entry, once it is computed (else None)."""
    entry = ctx.store.entry(disk_key(ctx))
    return entry if entry is not None and entry.state == "done" else None


def disk_shown(views: list, demo: SpillDemo, entry) -> dict:
    """The demo in the section's views (summary, table, chart), saying where it was run."""
    when = "run now on this machine" if entry is None else f"run on this machine, {origin(entry)}"
    d = disk_outputs(demo, when.replace("computed ", ""))
    return dict(zip(views, (d.summary, d.table, d.chart)))


def _show_me(ctx: AppContext, live: gr.Checkbox, views: list) -> None:
    """Learn's disk-tier show-me: answered from the stored demo in its own click, its "Look for" line read from it."""

    def answer(_request, fresh) -> dict | None:
        entry = None if fresh else stored_disk(ctx)
        return None if entry is None else disk_shown(views, entry.value, entry)

    def look_for(_values: dict) -> str | None:
        entry = stored_disk(ctx)
        return None if entry is None else fig.disk_demo_look_for(entry.value)

    ctx.answers["blocks.disk_demo"] = ShowMeAnswer([live], views, answer)
    ctx.look_fors["blocks.disk_demo"] = look_for


def build_disk_demo(ctx: AppContext) -> None:
    """The disk-tier show-me: a button whose result is stored like the other show-mes (``blocks.disk_demo``)."""
    gr.Markdown(DISK.format(memory=format_bytes(ctx.settings.prefix_cache_mb * 2**20)))
    with gr.Row():
        button = gr.Button("Show the disk tier (a small store)", variant="primary", elem_id="disk-demo-run")
        live = live_box("disk-demo-live")
    summary = gr.Markdown(elem_id="disk-demo-summary")
    table = gr.Dataframe(
        waiting_table("Press Show the disk tier (a small store) to fill this table"),
        label="Each request of the demo",
        interactive=False,
        elem_id="disk-demo-table",
    )
    chart = captioned_plot("Where each request's prompt came from", "disk-demo-chart", fig.CAPTIONS["disk"])
    ctx.components["blocks.disk_demo"] = button

    def compute(report, should_stop) -> SpillDemo:
        return spill_demo(ctx.lm)

    def plan(values: dict) -> tuple:
        ctx.store.plan(disk_key(ctx), "disk-tier demo", compute)
        return disk_key(ctx)

    ctx.planners["blocks.disk_demo"] = plan
    _show_me(ctx, live, [summary, table, chart])

    def run(job) -> dict:
        return disk_shown([summary, table, chart], *shared(job, disk_key(ctx), compute, live=bool(job.req)))

    job = ModelJob(
        "disk-tier demo",
        check=lambda _ctx, fresh: bool(fresh),
        run=run,
        size=lambda _r: Size(PROMPT_TOKENS, 1, runs=len(ORDER)),
        store=True,
        progress=True,
    )
    job.button(ctx, button, [live], [summary, table, chart])
