"""The solo driver: one :class:`~kvviz.capture.generation.Generation` run alone, forward by forward.

Every one-at-a-time run in kvviz goes through :func:`forwards` — a capture
(:func:`kvviz.capture.loop.capture_iter`), an eviction run (:func:`kvviz.eviction.run.run_policy`),
the Sinks demo's streamed perplexity (:func:`kvviz.eviction.demos.streaming_nll`), the lesson's cached
generation (:func:`kvviz.lessons.nocache.generate_with_cache`) and the quantized-cache comparison
(:func:`kvviz.quant.cache.teacher_forced`) — so they feed, position and record a run the one way the
lecture-hall engine (:mod:`kvviz.engine`) does for many runs together. Usage::

    from kvviz.capture.generation import Generation
    from kvviz.capture.options import Decode
    from kvviz.capture.drive import drive, forwards
    g = drive(lm, Generation(lm, "Hello", decode=Decode(max_new_tokens=8)))  # to its end; g.finish() gives the Trace
    for f in forwards(lm, Generation(lm, "Hello")):  # or step by step
        print(len(f.feed), f.produced, f.wall_s)

The generator holds inference mode (and the capture's attention wrapper, when ``wrapped``) from its
first step to its last, so code between two steps runs under them too, as it did in each loop's own
``with``; runs compared step by step are therefore driven one after the other, never interleaved
(two suspended drivers would restore inference mode in the wrong order).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass

import torch

from kvviz.capture.attention_fn import installed
from kvviz.capture.generation import Generation
from kvviz.capture.model_io import forward
from kvviz.models import LoadedModel

Around = Callable[[Generation], AbstractContextManager]


@dataclass(frozen=True)
class Forward:
    """One forward of a solo run, after the run took its logits."""

    feed: list[int]  # the tokens fed
    start: int  # the position of the first
    logits: torch.Tensor  # what the forward returned: [q, vocab] (q = g.logits_to_keep, or every fed position)
    produced: bool  # a token came of it (False for a prompt chunk that ends before the prompt's last token)
    decode: bool  # it fed a token the run produced (a decode step), not prompt tokens
    wall_s: float  # from choosing the feed to the taken logits: forward, step hook, bookkeeping
    cpu_s: float  # CPU seconds of the same (this process, all threads): steadier on a busy machine


def forwards(
    lm: LoadedModel, g: Generation, *, wrapped: bool = True, around: Around | None = None
) -> Iterator[Forward]:
    """Run ``g`` alone to its end, yielding after every forward (``g.finish()`` is the caller's).

    ``wrapped``: route attention through the capture's wrapper (a recorder needs it, and so do caches that
    bring their own attention); False runs the model's attention as loaded. ``around(g)``: a context
    entered around each forward, after the feed is chosen and before ``g`` takes the logits (an
    eviction run gathers the prefill's query statistics in it).
    """
    with ExitStack() as stack:
        stack.enter_context(torch.inference_mode())
        if wrapped:
            stack.enter_context(installed(lm.model, state_layers=g.trace.model.attention_layers is not None))
        while not g.done:
            t0, c0 = time.perf_counter(), time.process_time()
            decode = g.step > 0
            feed, start = g.next_feed()
            with around(g) if around is not None else nullcontext():
                logits = forward(lm, feed, start, g.cache, g.feed_recorder, g.logits_to_keep)
            produced = g.take(logits, len(feed))
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            yield Forward(feed, start, logits, produced, decode, wall, cpu)


def drive(lm: LoadedModel, g: Generation, **kwargs) -> Generation:
    """:func:`forwards` to the end (``kwargs`` are its); returns ``g``, not yet finished."""
    for _ in forwards(lm, g, **kwargs):
        pass
    return g
