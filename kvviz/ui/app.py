"""Assemble the tabs into one Gradio Blocks app (``build_app``); ``app.py`` launches it."""

from __future__ import annotations

import gradio as gr
from starlette.middleware import Middleware

from kvviz.ui import attention, breakcache, leaderboard, learn, nocache, quant
from kvviz.ui.blocks import tab as blocks
from kvviz.ui.eviction import tab as eviction
from kvviz.ui.generate import tab as generate
from kvviz.ui.memory import tab as memory
from kvviz.ui.page import (
    deeplinks,
    first_sight,
    plotly_preload,
    present,
    quiet_events,
    status_timer,
    tab_switch,
    toasts,
)
from kvviz.ui.serving import precompute
from kvviz.ui.serving.context import AppContext
from kvviz.ui.serving.identity import McpCallers

# (tab title, tab id, module with ``build(ctx)``); the Learn tab and ``?tab=`` links name a tab by its id
TABS = [
    ("Generate", "tab_generate", generate),
    ("Attention", "tab_attention", attention),
    ("Eviction", "tab_eviction", eviction),
    ("Memory", "tab_memory", memory),
    ("Quantization", "tab_quant", quant),
    ("Cache vs no cache", "tab_nocache", nocache),
    ("Learn", "tab_learn", learn),
    # after Learn (and after Eviction, whose inputs it fills): with large presentation fonts the last tabs may
    # wrap onto a second row
    ("Leaderboard", "tab_leaderboard", leaderboard),
    ("Blocks", "tab_blocks", blocks),
    ("Break the cache", "tab_breakcache", breakcache),
]

# How often Gradio's queue loops wake: the one looking for a new event while it has none to start (its own pace:
# every 1 ms, a wake-up that took 6 % of a core on an idle server and, in a room, the interpreter lock from the
# engine's thread 1,000 times a second: a room of 24 in process took 6.15 s beside such a loop against 5.42 s
# beside one at 20 ms), and the one sending progress updates while jobs run (its own: every 10 ms). A new request
# then waits at most this long to start, a progress bar moves at most this often.
QUEUE_POLL_S = 0.02

THEME = gr.themes.Soft(primary_hue="orange", secondary_hue="blue")
# scripts for the page's <head>: charts drawn at the presentation scale, plotly loaded while the page is idle
HEAD = present.HEAD + plotly_preload.HEAD + toasts.HEAD
CSS = """
.caption {font-size: 0.92em; opacity: 0.85}
/* tables: headers break between words, never inside one; a wide table scrolls instead of being cut */
.prose table {display: block; max-width: 100%; overflow-x: auto}
.prose th, .prose td, .table-wrap th, .table-wrap td, .table-wrap th *, .table-wrap td *, table th {
  word-break: normal !important; overflow-wrap: normal !important; hyphens: none}
.prose th, .prose td {white-space: nowrap}
.table-wrap, .table-container {overflow-x: auto !important; max-width: 100%}
/* phones: the tabs wrap onto rows (gr.Tabs(overflow_behavior="wrap")), charts without toolbars over their
   labels, the model card's one-row table read down the page (its header beside its value) instead of cut */
@media (max-width: 640px) {
  .js-plotly-plot .modebar-container {display: none !important}
  .gradio-container {padding-left: 6px !important; padding-right: 6px !important}
  #model-card table {display: grid !important; grid-auto-flow: column; grid-template-rows: repeat(7, auto);
    grid-template-columns: max-content 1fr; overflow-x: visible}
  #model-card thead, #model-card tbody, #model-card tr {display: contents}
  #model-card th, #model-card td {white-space: normal}
}
/* presentation mode: tab_learn toggles body.kvviz-present (or ?present=1) */
body.kvviz-present, body.kvviz-present .gradio-container {
  background: #fff !important; color: #000;
  --body-text-color: #000; --body-text-color-subdued: #111; --block-label-text-color: #000;
  --block-title-text-color: #000; --block-info-text-color: #111; --table-text-color: #000;
  --body-text-size: 24px; --prose-text-size: 24px; --input-text-size: 22px; --block-label-text-size: 20px;
  --block-title-text-size: 22px; --block-info-text-size: 20px; --section-header-text-size: 24px;
  --checkbox-label-text-size: 20px; --button-large-text-size: 24px; --button-medium-text-size: 22px;
  --button-small-text-size: 20px; --text-sm: 20px; --text-md: 24px; --text-lg: 28px; --text-xl: 34px;
}
body:not(.kvviz-present) #present-toggle::after {content: ": off"}
body.kvviz-present #present-toggle::after {content: ": on"}
body.kvviz-present #present-toggle {outline: 3px solid #f97316}
body.kvviz-present .gradio-container {max-width: 100% !important; font-size: 24px}
body.kvviz-present .prose, body.kvviz-present .prose p, body.kvviz-present .prose li {font-size: 24px !important; line-height: 1.45}
body.kvviz-present .prose h2 {font-size: 36px !important}
body.kvviz-present .prose h3 {font-size: 30px !important}
body.kvviz-present button[role="tab"] {font-size: 22px !important; font-weight: 600}
/* a chart's label gets its own line above the chart instead of floating over the chart's title */
body.kvviz-present [data-testid="block-label"].float {position: static !important; margin: 0 0 8px 0 !important}
/* a show-me's view and the controls it set: outlined for a few seconds (tab_learn's PRESS_JS) */
.kvviz-spot {outline: 4px solid #f97316 !important; outline-offset: 4px; border-radius: 6px;
  animation: kvviz-spot 1s ease-in-out 3}
@keyframes kvviz-spot {50% {outline-color: rgba(249, 115, 22, 0.25)}}
body.kvviz-present .caption, body.kvviz-present footer {display: none !important}
/* the link box takes no room on the first screen until Copy link fills it; the toggle keeps one line */
#link-url:has(textarea:placeholder-shown), #link-url:has(input:placeholder-shown),
.form:has(> #link-url textarea:placeholder-shown), .form:has(> #link-url input:placeholder-shown) {
  display: none !important}
/* a chart with nothing to show yet takes no room: no empty frame on any tab (it appears once drawn) */
.block:has(> [aria-label="Empty value"]), .block:has(> div > [aria-label="Empty value"]) {display: none !important}
body.kvviz-present #present-toggle {white-space: nowrap; flex-wrap: nowrap; min-width: max-content !important}
/* what to look for after a show-me: the point of the view, in large type where the room can read it */
body.kvviz-present .learn-note, body.kvviz-present .learn-note p {font-size: 30px !important; line-height: 1.35;
  font-weight: 600}
"""


def serve(demo: gr.Blocks, settings, ctx: AppContext | None = None) -> dict:
    """Turn on the queue and return the ``launch`` options the app needs (with ``ctx``, ``/metrics`` and
    ``/kv-events`` beside Gradio's routes: :func:`routes`).

    Model handlers carry no Gradio concurrency limit (the gate in ``kvviz/ui/serving/jobs.py`` is the model's
    queue), so each job that waits at the gate holds a worker: there must be one for every job the
    gate may queue or the engine may follow, plus some for the quick events (checks, redraws) that must never wait behind them.

    Uploads stop at the largest file the app reads (a config.json, ``KVVIZ_MAX_CONFIG_BYTES``): Gradio refuses a
    bigger one while it streams in, instead of keeping it an hour. Each MCP request carries a signed note of its
    caller, so MCP clients are sessions of their own (``kvviz/ui/serving/identity.py``). The page's HTML starts with
    the script that keeps Gradio's status timers off the browser's frames (``kvviz/ui/page/status_timer.py``).
    """
    jobs = settings.queue_size + settings.concurrency + settings.room_size
    demo.queue(max_size=jobs + 16, default_concurrency_limit=settings.concurrency)
    queue = demo._queue
    queue.sleep_when_free = max(queue.sleep_when_free, QUEUE_POLL_S)
    queue.progress_update_sleep_when_free = max(queue.progress_update_sleep_when_free, QUEUE_POLL_S)
    callers = Middleware(McpCallers, proxy_hops=settings.proxy_hops)
    middleware = [callers, Middleware(status_timer.FirstScript)]
    app_kwargs: dict = {"middleware": middleware, **({} if ctx is None else {"routes": routes(ctx)})}
    return {"max_threads": jobs + 32, "max_file_size": settings.max_config_bytes, "app_kwargs": app_kwargs}


def routes(ctx: AppContext) -> list:
    """``GET /metrics`` (Prometheus' text format, :mod:`kvviz.engine.metrics`) and ``GET /kv-events`` (the prefix
    cache's KV events in vLLM's schema, JSON Lines; a public deployment's show only shared blocks' tokens), added
    to Gradio's FastAPI app when it is created (``launch(app_kwargs=…)``)."""
    from starlette.responses import PlainTextResponse, Response
    from starlette.routing import Route

    from kvviz.engine.metrics import CONTENT_TYPE, exposition, read_numbers

    def engine():  # on ZeroGPU the engine runs in the GPU worker: the main process reports its gates only
        return ctx._engine

    async def metrics(_request) -> Response:
        store = None if engine() is None else engine().prefix
        numbers = read_numbers(ctx.lm.name, store, [ctx.jobs.gate, ctx.jobs.room], ctx.jobs.refusals.snapshot())
        return Response(exposition(numbers), media_type=CONTENT_TYPE)

    async def kv_events(_request) -> Response:
        store = None if engine() is None else engine().prefix
        text = "" if store is None else store.kv_events(None, private=ctx.settings.public)
        return PlainTextResponse(text, media_type="application/jsonl")

    return [Route("/metrics", metrics), Route("/kv-events", kv_events)]


def build_app(ctx: AppContext) -> gr.Blocks:
    """The whole page. Tabs are built in order; the Generate event then refreshes the others."""
    with gr.Blocks(title="kvviz — see the KV cache") as demo:
        ctx.trace_state = gr.State(None)
        gr.Markdown(
            "# kvviz — see a transformer's KV cache\n"
            "A real model generates while every layer's keys, values and attention are captured."
        )
        links = deeplinks.bar()
        generate_event = None
        built: dict[str, gr.Tab] = {}
        ctx.tab_box = tab_switch.box()
        with gr.Tabs(overflow_behavior="wrap") as ctx.tabs:
            # Learn is built after every other tab (its show-mes set their components and press their buttons,
            # which must exist), then put back in its place in the bar: the page lays tabs out in child order
            for title, tab_id, module in sorted(TABS, key=lambda t: t[2] is learn):
                with gr.Tab(title, id=tab_id) as built[tab_id]:
                    result = module.build(ctx)
                    if module is generate:
                        generate_event = result
        ctx.tabs.children[:] = [built[tab_id] for _, tab_id, _ in TABS]
        for tab_id, (example, line) in ctx.examples.items():  # each tab's first open draws its ready example
            first_sight.install(ctx, built[tab_id], example, line)
        # views of a stored (show-me) trace are drawn once and reused by every session
        ctx.listeners[:] = [(precompute.memo_listener(ctx, fn), i, o) for fn, i, o in ctx.listeners]
        if generate_event is not None:
            for fn, inputs, outputs in ctx.listeners:
                generate_event = generate_event.then(fn, inputs, outputs, api_name=False)
                if ctx.tab_box in outputs:  # a listener that opens a tab: in the page, after it
                    generate_event = tab_switch.open_after(generate_event, ctx.tabs, ctx.tab_box)
        present.install(ctx, demo)
        deeplinks.install(ctx, demo, links, {title: tab_id for title, tab_id, _ in TABS})
    quiet_events.install(demo)  # last: every event is wired
    return demo
