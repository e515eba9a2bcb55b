"""What the Generate tab shows while a run streams, and how often.

The model runs in a worker (:class:`kvviz.ui.serving.streaming.Background`); :class:`LiveRun` turns the snapshots it
hands the handler into updates of the tab's views. The status line and the text go out every :data:`STATUS_S`
seconds; the token chips, the plotly charts and the waste counter's long paragraph, the costliest to redraw, every
:data:`FIGURES_S` (the charts redrawn in place on the charts the page opened on by
:mod:`kvviz.ui.page.plot_redraw`, since a ``gr.Plot`` builds its chart anew for each value; the last ones through
the ``gr.Plot`` components, whose value they become); everything once at the end, and the export files just after it
(:meth:`LiveRun.files`: writing the compressed ``.npz`` is the end's slowest part, which "Done" and the final charts
need not wait for). Gradio sends a streamed output as a diff of its previous value, so the chips cost one new entry
per token on the wire, and the charts draw at most :data:`~kvviz.figures.generate.GROWTH_POINTS` points: an update
never costs more as the run grows.

The pace is set by the page, not the server: each streamed message costs the browser's main thread tens of
milliseconds whatever it carries (a redraw of the chips and charts several times that), and where the browser shares
the model's cores, as on a laptop, that time comes out of the model's decode (``bench/page_speed.py``). So the
text a visitor reads moves a few times a second, and the views that show the same tokens as pictures follow with
the charts.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

import gradio as gr
from gradio.components import Component

from kvviz.capture.model_io import Progress
from kvviz.capture.trace import Trace
from kvviz.figures import generate as fig
from kvviz.lessons.waste import forward_passes
from kvviz.ui.generate.views import Frame, Views
from kvviz.ui.page import plot_redraw
from kvviz.ui.serving.streaming import Snapshot
from kvviz.units import format_bytes, plural

STATUS_S = 0.75  # the status line and the text at most this often while streaming
FIGURES_S = 2.0  # the chips, the cache-growth chart, the memory gauge and the waste counter at most this often
PENDING_CHECK = "Cached vs full recompute: checked when generation ends."


def mark(trace: Trace) -> tuple[int, str]:
    """Taken in the worker as each step is yielded: the steps done and the text so far (O(1))."""
    return len(trace.steps), trace.text


def view(snap: Snapshot[Trace]) -> Trace | None:
    """The trace as it was when the snapshot's step was yielded (the worker keeps appending to it)."""
    trace = snap.item
    if trace is None or snap.done:
        return trace
    n_steps, text = snap.mark
    cut = copy.copy(trace)  # shallow: the lists are sliced, the arrays (None while running) shared
    cut.steps = trace.steps[:n_steps]
    cut.token_ids = trace.token_ids[: trace.n_prompt + n_steps]
    cut.tokens = trace.tokens[: trace.n_prompt + n_steps]
    cut.text = text
    return cut


def finished(snap: Snapshot[Trace]) -> bool:
    """The run's last snapshot, its arrays filled (a run that failed or was cut off before its end has none)."""
    return snap.done and snap.item is not None and snap.item.colsum is not None


def progress_line(progress: Progress | None, generated: int) -> str | None:
    """What the worker is doing between steps, if it says: a long prefill, or the check."""
    if progress is None:
        return None
    if progress.phase == "prefill" and generated == 0:
        return (
            f"Prefill: {progress.done:,} / {progress.total:,} prompt tokens through the model "
            "(the whole prompt in parallel, one chunk at a time)…"
        )
    if progress.phase == "verify":
        return (
            "Checking: the whole sequence again from scratch, without the cache and without kvviz's capture… "
            f"({plural(generated, 'token')} generated)"
        )
    return None


def waste_text(trace: Trace) -> str:
    """The chapter's waste counter for this run, and why its formula gives a larger number than the loop's count."""
    length, n = trace.n_prompt, trace.n_generated
    fp = forward_passes(length, n)
    one = (
        " With one generated token there is nothing to re-run yet: both loops make the same single pass over "
        "the prompt."
        if n == 1
        else ""
    )
    return (
        f"**Token-forward passes for this run** ({length} prompt + {plural(n, 'generated token')}): "
        f"with the cache **{fp.with_cache:,}** (the prompt once, then each new token but the last), without it "
        f"**{fp.without_cache:,}** (step i re-runs all {length} + i tokens, i = 0 … {n - 1}) — "
        f"**{fp.ratio:,.1f}×** the work.{one}\n\n"
        f"**Exact count vs the chapter's formula.** The count above is what a loop feeds: "
        f"{length} + ({length} + 1) + … + ({length} + {n - 1}) = NL + N(N − 1)/2 = {fp.without_cache:,}. "
        f"The chapter writes the sum over t = L … L + N, which has one more term: a pass over all "
        f"{length} + {n} = {length + n} tokens, which no loop needs (the last token is never fed back). "
        f"That sum is {fp.chapter_without_cache:,} = {fp.without_cache:,} + {fp.chapter_extra:,}, which the "
        "chapter rounds to NL + N²/2; for long runs the extra term is negligible, for short ones it dominates "
        "the gap."
    )


def replay_range(snap: Snapshot[Trace]) -> gr.Slider | None:
    """The replay slider's update for a snapshot: the finished run's steps, at its last one (else None: left alone)."""
    trace = snap.item
    if not snap.done or trace is None or trace.colsum is None:
        return None
    return gr.Slider(maximum=max(1, len(trace.steps) - 1), value=len(trace.steps) - 1)


class LiveRun:
    """One run's rendering. Per-run constants (the gauge's budget and room for tokens) are fixed here, once;
    :meth:`outputs` renders a snapshot as ``{component: value}`` of the tab's views, leaving out what is not
    due or did not change."""

    def __init__(
        self, views: Views, frame: Frame, prompt_tokens: list[str], export: Callable[[Trace], tuple[str, str]]
    ):
        self.views, self.frame = views, frame
        self.prompt_spans = [(fig.chip_text(t), "prompt") for t in prompt_tokens]
        self.export = export
        self._figures_at = float("-inf")
        self._figures_steps = -1
        self._cleared = False

    def outputs(self, snap: Snapshot[Trace], note: str = "") -> dict[Component, Any]:
        """What one snapshot changes on the page."""
        v = self.views
        trace = view(snap)
        final = finished(snap)
        generated = trace.n_generated if trace is not None else 0
        status = progress_line(snap.progress, generated) if not snap.done else None
        if trace is None:  # still in the prefill: the prompt's chips, the previous run's text and check gone
            self._cleared = True
            return {
                v.status: status or "Starting…",
                v.tokens: self.prompt_spans,
                v.answer: "",
                v.check: PENDING_CHECK,
                v.npz: None,
                v.csv: None,
            }
        if status is None:
            status = (
                f"{'Done' if final else 'Generating'}: {plural(generated, 'token')}, cache "
                f"{format_bytes(trace.cache_bytes)} ({trace.steps[-1].cache_lens[0]} tokens in layer 0)"
            )
            if final:
                status += (
                    f" · stop: {trace.stop_reason} · {trace.timings.get('decode_tokens_per_s') or 0:.1f} tokens/s{note}"
                )
        out: dict[Component, Any] = {v.status: status, v.answer: trace.text}
        now = time.monotonic()
        if snap.done or (now - self._figures_at >= FIGURES_S and len(trace.steps) != self._figures_steps):
            out[v.tokens] = fig.token_spans(trace)  # hundreds of chips: redrawn as seldom as a chart
            out[v.check] = fig.equivalence_text(trace) if final else PENDING_CHECK
            out[v.waste] = waste_text(trace)  # a long Markdown paragraph: rendered as seldom as a chart
            figures = {plot: draw(trace, self.frame) for plot, draw in v.charts().items()}
            if snap.done:  # the run's last through the plots themselves: their value
                out.update(figures)
            else:  # the ones before it redrawn in place on the charts the page opened on
                out[v.redraw] = plot_redraw.payload(figures)
            self._figures_at, self._figures_steps = now, len(trace.steps)
        if final:
            out[v.trace] = trace
        elif not self._cleared:  # the previous run's files go with its first update
            out[v.npz] = out[v.csv] = None
        self._cleared = True
        return out

    def files(self, trace: Trace) -> dict[Component, Any]:
        """The finished run's export files, written now: sent in an update of their own after the run's end."""
        v = self.views
        npz, csv = self.export(trace)
        return {v.npz: npz, v.csv: csv}
