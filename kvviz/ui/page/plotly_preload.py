"""The plotly library loads while the page is idle, so the first chart a visitor opens does not wait for it.

Gradio fetches its plotly chunk (~4.5 MB) only when a chart first gets a figure, and compiling it holds
the page for about a second on a slow machine: the first chart of a visit (a lecture's first show-me)
paid for it. :data:`HEAD` imports the same file, from the folder of the page's own entry script, once
the page is idle; the browser keeps one copy of a module per address, so Gradio's later import is
instant. A Gradio without that file (another version's layout) simply preloads nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import gradio as gr


def plotly_chunk() -> str | None:
    """The file name of the installed Gradio's plotly chunk (None unless exactly one is found)."""
    assets = Path(gr.__file__).parent / "templates" / "frontend" / "assets"
    found = sorted(assets.glob("PlotlyPlot-*.js"))
    return found[0].name if len(found) == 1 else None


PRELOAD_JS = """
(() => {
  const file = __FILE__;
  if (!file || window.kvvizPlotlyPreload) return;
  window.kvvizPlotlyPreload = true;
  const start = () => {
    const entry = [...document.querySelectorAll('script[src]')].find((s) => /\\/assets\\/index-[^/]*\\.js$/.test(s.src));
    if (entry) import(new URL(file, entry.src).href).catch(() => {});
  };
  const idle = () => (window.requestIdleCallback ? requestIdleCallback(start, {timeout: 5000}) : setTimeout(start, 500));
  if (document.readyState === 'complete') idle();
  else window.addEventListener('load', idle, {once: true});
})();
""".replace("__FILE__", json.dumps(plotly_chunk()))
HEAD = f"<script>{PRELOAD_JS}</script>"
