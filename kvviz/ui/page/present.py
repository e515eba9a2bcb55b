"""Presentation mode: large type on the page (CSS) and in every chart (plotly layout), arrow keys that step.

The toggle (built by the Learn tab) or ``?present=1`` puts ``kvviz-present`` on the page body. Charts
are scaled in the browser, with no trip to the server: :data:`SCALE_JS` wraps ``Plotly.react`` (which
Gradio draws every chart with) so a chart drawn while presenting is drawn once, already at the
presentation scale, and switching the mode redraws the charts on the page at the new scale. The rule
and its factors come from :func:`kvviz.figures.scale.rule` (the browser's copy of
:func:`~kvviz.figures.scale.scaled`). ← / → step the step slider of the visible tab (``.kvviz-step``),
never while the focus is in a text field.
"""

from __future__ import annotations

import json

import gradio as gr

from kvviz.figures.scale import rule
from kvviz.ui.serving.context import AppContext

PRESENT_CLASS = "kvviz-present"
STEP_CLASS = "kvviz-step"  # the sliders ← / → step
# each tab's step slider, marked at build time where the tab registered it
STEP_KEYS = ("generate.step", "attention.step", "eviction.step", "blocks.step")

# scaled() in the browser: window.kvvizPresent.scale(data, layout, factor) → [data, layout] (copies; the
# inputs are never changed), Plotly.react wrapped to draw at the mode's scale, redraw() after a switch
SCALE_JS = """
(() => {
  if (window.kvvizPresent) return;
  const R = __RULE__, CLS = '__CLS__';
  const isObj = (o) => o !== null && typeof o === 'object' && !Array.isArray(o);
  const scaleOf = (layout) => (isObj(layout) && isObj(layout.meta) && typeof layout.meta[R.meta] === 'number'
    ? layout.meta[R.meta] : 1);
  const gain = (f) => 1 + R.gain * (f - 1);
  // obj with the font at path (a list of keys) resized by ratio; objects on the path are copied
  const font = (obj, path, ratio) => {
    if (!isObj(obj)) return obj;
    if (!path.length) {
      if (typeof obj.size === 'number') return {...obj, size: obj.size * ratio};
      if (Array.isArray(obj.size)) return {...obj, size: obj.size.map((s) => s * ratio)};
      return obj;
    }
    const [key, ...rest] = path, child = font(obj[key], rest, ratio);
    return child === obj[key] ? obj : {...obj, [key]: child};
  };
  const fonts = (obj, paths, ratio) => paths.reduce((o, p) => font(o, p.split('.'), ratio), obj);
  const scale = (data, layout, factor) => {
    const cur = scaleOf(layout), ratio = factor / cur;
    if (Math.abs(ratio - 1) < 1e-9) return [data, layout];
    let lay = {...(isObj(layout) ? layout : {})};
    const base = isObj(lay.font) ? lay.font : {};
    lay.font = {...base, size: (base.size || R.font * cur) * ratio};
    const title = typeof lay.title === 'string' ? {text: lay.title} : (isObj(lay.title) ? lay.title : {});
    const tfont = isObj(title.font) ? title.font : {};
    lay.title = {...title, font: {...tfont, size: (tfont.size || R.title) * gain(factor) / gain(cur)}};
    lay = fonts(lay, R.layout_fonts, ratio);
    for (const key of Object.keys(lay)) {
      if (key.startsWith('xaxis') || key.startsWith('yaxis')) lay[key] = fonts(lay[key], R.axis_fonts, ratio);
    }
    if (Array.isArray(lay.annotations)) lay.annotations = lay.annotations.map((a) => font(a, ['font'], ratio));
    const margin = {...(isObj(lay.margin) ? lay.margin : {})};
    for (const [side, d] of Object.entries(R.margin)) {
      if (margin[side] != null) margin[side] = Math.round(margin[side] * ratio);
      else if (ratio > 1) margin[side] = Math.round(d * ratio);
    }
    lay.margin = margin;
    if (lay.height != null) lay.height = Math.round(lay.height * gain(factor) / gain(cur));
    lay.meta = {...(isObj(lay.meta) ? lay.meta : {}), [R.meta]: factor};
    return [Array.isArray(data) ? data.map((t) => fonts(t, R.trace_fonts, ratio)) : data, lay];
  };
  const target = () => (document.body.classList.contains(CLS) ? R.present : 1);
  // the title broken into lines that fit the chart's width (plotly never wraps one; a long title ran off
  // the chart's edge on a phone or in half of a presentation screen); the title as written is kept in meta
  const pen = document.createElement('canvas').getContext('2d');
  const fit = (gd, layout) => {
    const el = typeof gd === 'string' ? document.getElementById(gd) : gd;
    const width = (isObj(layout) && layout.width) || (el && el.clientWidth) || 0;
    if (!width || !isObj(layout)) return layout;
    const title = typeof layout.title === 'string' ? {text: layout.title} : layout.title;
    const meta = isObj(layout.meta) ? layout.meta : {};
    const text = typeof meta.kvviz_title === 'string' ? meta.kvviz_title : isObj(title) && title.text;
    if (typeof text !== 'string' || !text) return layout;
    const base = isObj(layout.font) && layout.font.size ? layout.font.size : R.font;
    const size = (isObj(title.font) && title.font.size) || 1.4 * base;
    pen.font = `${size}px "Open Sans", verdana, arial, sans-serif`;
    const x = typeof title.x === 'number' ? title.x : 0.05, room = width * (x < 1 / 3 ? 1 - x : 1) - 24;
    const lines = text.split('<br>').flatMap((line) => {
      if (line.includes('<') || pen.measureText(line).width <= room) return [line];
      const out = [];
      for (const word of line.split(' ')) {
        const last = out.length ? `${out[out.length - 1]} ${word}` : word;
        if (out.length && pen.measureText(last).width > room) out.push(word);
        else if (out.length) out[out.length - 1] = last;
        else out.push(word);
      }
      return out;
    });
    if (lines.length === text.split('<br>').length && text === title.text) return layout;
    // wrapped: from the top of the chart, below where the panel's label floats, pushing the plot area down
    const top = {yref: 'container', y: 1, yanchor: 'top', pad: {t: 36}, automargin: true};
    return {...layout, title: {...title, text: lines.join(' <br>'), ...top}, meta: {...meta, kvviz_title: text}};
  };
  const hook = (P) => {
    if (!P || P.kvvizScales || typeof P.react !== 'function') return;
    const react = P.react;
    P.react = function (gd, data, layout, config) {
      if (isObj(data)) {  // react(gd, {data, layout, config, frames})
        const [d, l] = scale(data.data, data.layout, target());
        return react.call(this, gd, {...data, data: d, layout: fit(gd, l)});
      }
      [data, layout] = scale(data, layout, target());
      return react.call(this, gd, data, fit(gd, layout), config);
    };
    P.kvvizScales = true;
  };
  const redraw = () => {
    for (const gd of document.querySelectorAll('.js-plotly-plot')) {
      if (window.Plotly && gd.layout && scaleOf(gd.layout) !== target()) window.Plotly.react(gd, gd.data, gd.layout);
    }
  };
  if (window.Plotly) hook(window.Plotly);
  else {  // Gradio loads plotly with the first chart: wrap it as it arrives, before it draws anything
    let P;
    Object.defineProperty(window, 'Plotly', {configurable: true, enumerable: true, get: () => P,
      set: (v) => { P = v; hook(v); }});
  }
  window.kvvizPresent = {rule: R, scale, scaleOf, target, redraw, fit};
})();
""".replace("__RULE__", json.dumps(rule())).replace("__CLS__", PRESENT_CLASS)
# in the page's <head> (app.py passes it to launch): plotly is wrapped before the first chart loads it
HEAD = f"<script>{SCALE_JS}</script>"
# the toggle: flip the body class and redraw the charts at the new scale (in the page only)
TOGGLE_JS = f"() => {{ document.body.classList.toggle('{PRESENT_CLASS}'); window.kvvizPresent.redraw(); return []; }}"
# Generate while presenting: the run's status line and token stream (below the prompt's inputs) come to the top
# of the screen, so the room watches the tokens arrive instead of the inputs. The scroll is measured from the
# stream, not the status line: the browser keeps the stream where it is while the status line above it fills.
# A stream longer than the screen is then followed: each new token scrolls the page just enough to be seen.
FOLLOW_JS = (
    "() => { const t = document.getElementById('token-stream'); if (!t || !document.body.classList.contains('__CLS__')) "
    "return []; window.scrollTo({top: Math.max(0, t.getBoundingClientRect().top + window.scrollY - 90)}); "
    "if (!window.kvvizFollow) { window.kvvizFollow = new MutationObserver(() => { "
    "if (!document.body.classList.contains('__CLS__')) return; "
    "const s = document.getElementById('token-stream'); const c = s && s.querySelectorAll('.token-container'); "
    "const last = c && c[c.length - 1]; if (!last) return; const b = last.getBoundingClientRect().bottom; "
    "if (b > innerHeight - 8) window.scrollBy({top: b - innerHeight + 24}); }); "
    "window.kvvizFollow.observe(t, {childList: true, subtree: true}); } return []; }"
).replace("__CLS__", PRESENT_CLASS)
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
# on page load: the scaling (if the <head> did not bring it), ?present=1 turns the mode on (charts already
# drawn are redrawn at its scale); keys are installed once
LOAD_JS = (
    """() => {
  __SCALE__
  __HELPER__
  const want = new URLSearchParams(window.location.search).get('present') === '1';
  if (want) document.body.classList.add('__CLS__');
  window.kvvizPresent.redraw();
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
  return [];
}""".replace("__CLS__", PRESENT_CLASS)
    .replace("__STEP__", STEP_CLASS)
    .replace("__HELPER__", STEP_HELPER_JS)
    .replace("__SCALE__", SCALE_JS)
)


def mark_step_sliders(ctx: AppContext) -> None:
    """Give each tab's step slider the class the arrow keys (and nothing else) look for."""
    for key in STEP_KEYS:
        comp = ctx.components.get(key)
        if comp is not None and STEP_CLASS not in (comp.elem_classes or []):
            comp.elem_classes = [*(comp.elem_classes or []), STEP_CLASS]


def install(ctx: AppContext, demo: gr.Blocks) -> None:
    """Wire the toggle, ``?present=1`` and the keys (call inside ``demo`` after every tab); charts scale in the
    page (``HEAD``, or this page-load script), so no chart travels back to the server."""
    mark_step_sliders(ctx)
    toggle = ctx.components.get("learn.present")
    if isinstance(toggle, gr.Button):
        toggle.click(None, None, None, js=TOGGLE_JS, api_name=False, queue=False, show_progress="hidden")
    go = ctx.components.get("generate.button")
    if isinstance(go, gr.Button):
        go.click(None, None, None, js=FOLLOW_JS, api_name=False, queue=False, show_progress="hidden")
    demo.load(None, None, None, js=LOAD_JS, api_name=False, queue=False, show_progress="hidden")
