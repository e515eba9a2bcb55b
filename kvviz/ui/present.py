"""Presentation mode: large type on the page (CSS) and in every chart (plotly layout), arrow keys that step.

The toggle (built by the Learn tab) or ``?present=1`` puts ``kvviz-present`` on the page body. Charts
are scaled on the server with :func:`kvviz.figures.scale.scaled`: switching the mode rescales every
chart on the page, and while it is on, a chart a handler redraws is rescaled once it arrives (a chart
already at the presentation scale is left alone, so this never loops). ← / → step the step slider of
the visible tab (``.kvviz-step``), never while the focus is in a text field.
"""

from __future__ import annotations

import json
from typing import Any

import gradio as gr
import plotly.io as pio

from kvviz.figures.scale import PRESENT_SCALE, scale_of, scaled
from kvviz.ui.context import AppContext

PRESENT_CLASS = "kvviz-present"
STEP_CLASS = "kvviz-step"  # the sliders ← / → step
# each tab's step slider, marked at build time where the tab registered it
STEP_KEYS = ("generate.step", "attention.step", "eviction.step", "blocks.step")

_IS_ON = f"document.body.classList.contains('{PRESENT_CLASS}')"
# the toggle: flip the body class, then send the new state and the charts to the server
TOGGLE_JS = f"(on, ...figs) => {{ document.body.classList.toggle('{PRESENT_CLASS}'); return [{_IS_ON}, ...figs]; }}"
# a chart was redrawn: send it only while presenting (otherwise nothing travels and nothing changes)
FOLLOW_JS = f"(fig) => [{_IS_ON} ? fig : null]"
# moving a Gradio slider from a script: set its value, then the events Gradio listens to (shared with play)
STEP_HELPER_JS = """
window.kvvizStep = (s, delta) => {
  const step = parseFloat(s.step) || 1, lo = parseFloat(s.min), hi = parseFloat(s.max), old = parseFloat(s.value);
  const v = Math.min(hi, Math.max(lo, old + delta * step));
  if (v === old) return false;
  Object.getOwnPropertyDescriptor(HTMLInputElement.prototype, 'value').set.call(s, String(v));
  for (const name of ['input', 'change']) s.dispatchEvent(new Event(name, {bubbles: true}));
  s.dispatchEvent(new PointerEvent('pointerup', {bubbles: true}));
  return true;
};
"""
# on page load: ?present=1 turns the mode on (and the charts already drawn are scaled); keys are installed once
LOAD_JS = (
    """(on, ...figs) => {
  __HELPER__
  const want = new URLSearchParams(window.location.search).get('present') === '1';
  if (want) document.body.classList.add('__CLS__');
  if (!window.kvvizKeysInstalled) {
    window.kvvizKeysInstalled = true;
    document.addEventListener('keydown', (e) => {
      if (!document.body.classList.contains('__CLS__') || (e.key !== 'ArrowRight' && e.key !== 'ArrowLeft')) return;
      if (e.altKey || e.ctrlKey || e.metaKey) return;
      const t = e.target, tag = (t && t.tagName) || '';
      if (tag === 'TEXTAREA' || tag === 'SELECT' || (t && t.isContentEditable)) return;
      if (tag === 'INPUT' && !['checkbox', 'radio', 'button'].includes(t.type)) return;  // typing, or a slider's own keys
      const s = [...document.querySelectorAll('.__STEP__ input[type=range]')].find((x) => x.offsetParent !== null);
      if (!s) return;
      e.preventDefault();
      window.kvvizStep(s, e.key === 'ArrowRight' ? 1 : -1);
    });
  }
  return [want, ...(want ? figs : figs.map(() => null))];
}""".replace("__CLS__", PRESENT_CLASS)
    .replace("__STEP__", STEP_CLASS)
    .replace("__HELPER__", STEP_HELPER_JS)
)


def _figure(payload: Any):
    """A plotly figure from a chart's value as the page sends it (None for an empty or non-plotly chart)."""
    if payload is None:
        return None
    kind = getattr(payload, "type", None) if not isinstance(payload, dict) else payload.get("type")
    text = getattr(payload, "plot", None) if not isinstance(payload, dict) else payload.get("plot")
    if kind != "plotly" or not text:
        return None
    return pio.from_json(text if isinstance(text, str) else json.dumps(text), skip_invalid=True)


def rescale(on: bool, *payloads: Any) -> list:
    """Every chart at the scale of the mode (on: presentation, off: the figure function's own)."""
    factor = PRESENT_SCALE if on else 1.0
    out: list = []
    for payload in payloads:
        fig = _figure(payload)
        out.append(gr.skip() if fig is None or scale_of(fig) == factor else scaled(fig, factor))
    return out


def follow(payload: Any):
    """A chart just redrawn while presenting: scale it up (once; a scaled one comes back unchanged)."""
    fig = _figure(payload)
    if fig is None or scale_of(fig) == PRESENT_SCALE:
        return gr.skip()
    return scaled(fig, PRESENT_SCALE)


def mark_step_sliders(ctx: AppContext) -> None:
    """Give each tab's step slider the class the arrow keys (and nothing else) look for."""
    for key in STEP_KEYS:
        comp = ctx.components.get(key)
        if comp is not None and STEP_CLASS not in (comp.elem_classes or []):
            comp.elem_classes = [*(comp.elem_classes or []), STEP_CLASS]


def install(ctx: AppContext, demo: gr.Blocks) -> None:
    """Wire the toggle, ``?present=1``, the keys and chart scaling (call inside ``demo`` after every tab)."""
    mark_step_sliders(ctx)
    plots = [b for b in demo.blocks.values() if isinstance(b, gr.Plot)]
    flag = gr.Checkbox(False, visible=False, elem_id="present-flag")
    toggle = ctx.components.get("learn.present")
    if isinstance(toggle, gr.Button):
        toggle.click(rescale, [flag, *plots], plots, js=TOGGLE_JS, api_name=False, queue=False, show_progress="hidden")
    demo.load(rescale, [flag, *plots], plots, js=LOAD_JS, api_name=False, queue=False, show_progress="hidden")
    for plot in plots:
        plot.change(follow, plot, plot, js=FOLLOW_JS, api_name=False, queue=False, show_progress="hidden")
