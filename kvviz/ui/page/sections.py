"""Sub-tabs inside a tab (the Blocks tab's sections): which one holds a component, so that a view opened from
elsewhere (a Learn show-me) also opens the sub-tab its controls and chart are in.

Gradio draws a sub-tab's content only once it is opened: a show-me that presses a button or scrolls to a chart in
a closed sub-tab would find nothing on the page. The page opens it by clicking its button (Learn's ``PRESS_JS``):
a ``gr.Tabs`` not yet drawn cannot be an event's output (Gradio's page fails on it).
"""

from __future__ import annotations

from collections.abc import Iterable

import gradio as gr
from gradio.context import Context


def by_elem_id(elem_id: str) -> gr.components.Component | None:
    """The component of the app being built whose element id is ``elem_id`` (None if none is, yet)."""
    root = Context.root_block
    if root is None or not elem_id:
        return None
    return next((b for b in root.blocks.values() if getattr(b, "elem_id", None) == elem_id), None)


def section_of(component, top: gr.Tabs | None) -> tuple[gr.Tabs, gr.Tab] | None:
    """The sub-tab bar below the page's ``top`` bar and its sub-tab that holds ``component`` (the innermost one),
    or None where the component is in no sub-tab."""
    block = getattr(component, "parent", None)
    while block is not None:
        bar = getattr(block, "parent", None)
        if isinstance(block, gr.Tab) and isinstance(bar, gr.Tabs) and bar is not top:
            return bar, block
        block = bar
    return None


def opening(components: Iterable, top: gr.Tabs | None) -> list[tuple[str, str]]:
    """``(sub-tab bar's element id, sub-tab title)`` for each bar whose sub-tab must be open to show every one of
    ``components`` (the first component found in a sub-tab wins where two are in sub-tabs of the same bar)."""
    out: dict[str, str] = {}
    for component in components:
        found = section_of(component, top) if component is not None else None
        if found is not None:
            bar, tab = found
            if not bar.elem_id:
                raise ValueError(f"the sub-tab bar of {tab.label!r} needs an elem_id to be opened from the page")
            out.setdefault(bar.elem_id, tab.label)
    return list(out.items())
