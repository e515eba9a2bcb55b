"""An event that shows no progress keeps no progress bookkeeping in the page.

Gradio's page keeps a loading status for every component an event has ever named as a progress target (by
default: its outputs), for the whole visit, and every message of a streamed run hands each of them a new status
object, which each component's status tracker then redraws: a run's ~20 messages times every component that a
page-load event, a timer or a run ever wrote (~64 on a kvviz page after one Generate). kvviz's events almost all
say ``show_progress="hidden"`` (their outputs carry their own status lines), so that work draws nothing: it is
CPU the page takes from the model when the browser shares the server's cores (``bench/page_speed.py``).
:func:`install` gives every such event an empty ``show_progress_on``, which Gradio's page reads as "no
progress targets": it then keeps no status for those components at all. Events that do show progress keep it.
"""

from __future__ import annotations

import gradio as gr


def install(demo: gr.Blocks) -> int:
    """Give every hidden-progress event of ``demo`` no progress targets; returns how many were changed.
    Call it when every event is wired (an event added later keeps Gradio's default)."""
    changed = 0
    for fn in demo.fns.values():
        if fn.show_progress == "hidden" and fn.show_progress_on is None:
            fn.show_progress_on = []
            changed += 1
    return changed
