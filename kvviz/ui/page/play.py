"""Play / pause for a step slider: replay a finished run one step at a time, in the browser.

The button runs only a page script (no server round trip of its own): a timer moves the slider by one
step at a fixed pace through ``window.kvvizStep`` (installed with the arrow keys by
``kvviz/ui/page/present.py``), so every step goes through the slider's own change event and its tab redraws
exactly as if the step had been dragged. Pressing again pauses; reaching the end, leaving the tab or a
slider at its end when play is pressed (it restarts from 0) are handled in the script.
"""

from __future__ import annotations

import json

import gradio as gr

STEPS_PER_S = 3.0  # slow enough to read the token, fast enough to see the cache grow
PLAY, PAUSE = "▶ Play", "⏸ Pause"
PLAY_JS = """() => {
  const id = __ID__, slider = __SLIDER__, every = __MS__;
  const btn = document.getElementById(id), s = document.querySelector('#' + slider + ' input[type=range]');
  const timers = window.kvvizPlayTimers = window.kvvizPlayTimers || {};
  const label = (text) => { if (btn) btn.textContent = text; };
  const stop = () => { clearInterval(timers[id]); delete timers[id]; label(__PLAY__);
                       if (btn) btn.classList.remove('kvviz-playing'); };
  if (timers[id] || !s || !window.kvvizStep) { stop(); return []; }
  if (parseFloat(s.value) >= parseFloat(s.max)) window.kvvizStep(s, -Infinity);  // at the end: start over
  timers[id] = setInterval(() => {
    if (s.offsetParent === null || !window.kvvizStep(s, 1)) stop();  // tab left, or the last step shown
  }, every);
  label(__PAUSE__);
  if (btn) btn.classList.add('kvviz-playing');
  return [];
}"""


def play_js(button_id: str, slider_id: str, steps_per_s: float = STEPS_PER_S) -> str:
    """The page script of one play button (``slider_id`` is the slider's element id)."""
    return (
        PLAY_JS.replace("__ID__", json.dumps(button_id))
        .replace("__SLIDER__", json.dumps(slider_id))
        .replace("__MS__", str(round(1000 / steps_per_s)))
        .replace("__PLAY__", json.dumps(PLAY))
        .replace("__PAUSE__", json.dumps(PAUSE))
    )


def play_button(slider: gr.Slider, button_id: str) -> gr.Button:
    """A Play/Pause button that steps ``slider`` (which must have an ``elem_id``) through its range."""
    if not slider.elem_id:
        raise ValueError("the slider a play button steps needs an elem_id")
    button = gr.Button(PLAY, elem_id=button_id, size="sm", scale=0, min_width=110, elem_classes=["kvviz-play"])
    button.click(None, None, None, js=play_js(button_id, slider.elem_id), api_name=False, queue=False)
    return button
