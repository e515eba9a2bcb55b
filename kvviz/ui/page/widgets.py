"""Page pieces every tab uses: a chart with the one sentence that explains it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import gradio as gr
import pandas as pd
from gradio.components import Component

from kvviz.safety import whole_number
from kvviz.ui.serving.gradio_adapter import pass_typed_values


def captioned_plot(label: str, elem_id: str, caption: str, value=None) -> gr.Plot:
    """A chart in its own column with its caption underneath (hidden in presentation mode)."""
    with gr.Column():
        plot = gr.Plot(value, label=label, elem_id=elem_id)
        gr.Markdown(caption, elem_classes="caption")
    return plot


REFUSED = (
    "⚠ **This request was refused** (see the message). The results that were here came from an earlier "
    "request, so they were cleared rather than shown under the new settings."
)


def stale_values(count: int, note_at: int = 0, blank: Sequence[Any] = ()) -> tuple:
    """Outputs after a refusal: the note in one slot, every other output emptied (or its ``blank`` value, by slot)."""
    fill = [*blank, *[None] * (count - len(blank))]
    return tuple(REFUSED if i == note_at else fill[i] for i in range(count))


def clear_on_refusal(event, outputs: list, note_at: int = 0, blank: Mapping[Component, Any] | None = None) -> None:
    """When ``event`` raises (bad input, a full queue), empty ``outputs`` so old results never look current;
    a component in ``blank`` goes back to that value instead (a chart the page redraws in place must stay)."""
    fill = [(blank or {}).get(c) for c in outputs]
    event.failure(
        lambda: stale_values(len(outputs), note_at, fill),
        None,
        outputs,
        queue=False,
        api_name=False,
        show_progress="hidden",
    )


def waiting_table(hint: str) -> pd.DataFrame:
    """An empty table whose only header says what fills it, instead of Gradio's bare "1 | 2 | 3"."""
    return pd.DataFrame(columns=[hint])


def typed_slider(*args, **kwargs) -> gr.Slider:
    """A slider whose typed number reaches the handler as typed, so the handler's own range message ("Layer
    must be between 0 and 29; got 99.") is shown instead of Gradio's "Value 99 is greater than maximum value
    29.", which names no control and leaves the number in the box (needs an ``elem_id``)."""
    return pass_typed_values(gr.Slider(*args, **kwargs))


def in_range(value, what: str, lo: int, hi: int) -> str | None:
    """None when ``value`` is a whole number in [lo, hi], else the app's message saying what to type."""
    try:
        whole_number(value, what, lo, hi)
    except ValueError as exc:
        return str(exc)
    return None
