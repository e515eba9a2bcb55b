"""The app's serving options: the queue Gradio runs for it."""

from __future__ import annotations

import gradio as gr

from kvviz.settings import Settings
from kvviz.ui.app import QUEUE_POLL_S, serve


def test_the_queue_looks_for_new_events_at_a_pace_that_leaves_the_engine_its_cores():
    with gr.Blocks() as plain:
        gr.Markdown("x")
    plain.queue()
    # Gradio's own pace, the attribute serve sets: were it renamed, setting it would silently do nothing
    assert plain._queue.sleep_when_free < QUEUE_POLL_S and plain._queue.progress_update_sleep_when_free < QUEUE_POLL_S
    with gr.Blocks() as demo:
        gr.Markdown("x")
    serve(demo, Settings())
    assert demo._queue.sleep_when_free == demo._queue.progress_update_sleep_when_free == QUEUE_POLL_S
