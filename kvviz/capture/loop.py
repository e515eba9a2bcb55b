"""One run alone: prefill + decode over a transformers cache, recording a Trace as the model generates.

``capture_iter`` yields the growing Trace after the prefill and after every decode step (the UI
streams from it) and reports what it is doing in between (prefill chunks, the equivalence check)
through ``progress``; ``capture`` runs to the end. Usage from a notebook::

    from kvviz import capture, load_model
    trace = capture(load_model(), "What is the capital of France?", chat=True, max_new_tokens=16)

The run's state and rules live in :class:`kvviz.capture.generation.Generation`, and the solo driver
(:func:`kvviz.capture.drive.forwards`) runs it forward by forward; this module adds the streaming and
the equivalence check (the lecture-hall engine, :mod:`kvviz.engine`, drives many runs together with
the same class).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from kvviz.capture.drive import forwards
from kvviz.capture.generation import Generation
from kvviz.capture.model_io import (
    Progress,
)
from kvviz.capture.options import options
from kvviz.capture.trace import Trace
from kvviz.capture.verify import check
from kvviz.models import LoadedModel


def capture_iter(
    lm: LoadedModel,
    prompt: str,
    *,
    verify: bool = False,
    progress: Callable[[Progress], None] | None = None,
    **kwargs,
) -> Iterator[Trace]:
    """Generate while recording; yields the same (growing) Trace after each step.

    Keyword arguments are the flat names of :class:`~kvviz.capture.generation.Generation`'s option
    groups (:func:`kvviz.capture.options.options`). ``verify`` re-runs the
    whole sequence without a cache at the end and stores the largest logit/attention-output
    difference (:mod:`kvviz.capture.verify`); ``progress`` hears of every prefill chunk and of the check.
    """
    g = Generation(lm, prompt, progress=progress, **options(verify=verify, **kwargs))
    report = progress or (lambda _: None)
    for f in forwards(lm, g):
        if f.produced and not g.done:
            yield g.trace
    with torch.inference_mode():
        trace = g.finish()
    if verify:  # outside the capture: the model as loaded, nothing of kvviz's in the way
        report(Progress("verify", 0, 1))
        trace.equivalence = check(lm, [g])[0]
    yield trace


def capture(lm: LoadedModel, prompt: str, **kwargs) -> Trace:
    """Run :func:`capture_iter` to the end and return the finished Trace."""
    *_, trace = capture_iter(lm, prompt, **kwargs)
    return trace
