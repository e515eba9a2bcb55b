"""What a :class:`~kvviz.capture.generation.Generation` is asked to do, in four typed groups.

A run is told how its prompt is fed (:class:`Feed`), how it picks tokens and when it ends
(:class:`Decode`), what it records (:class:`Recording`) and which cache it runs on (:class:`CacheSetup`).
Each group checks its own fields when built, so a bad option fails where it was written, before a
model is touched; the checks that need the prompt or the model (lengths, the context) stay in
``Generation``. :func:`options` maps the notebook's flat keywords (``capture(lm, p, chat=False,
max_new_tokens=8)``) onto the groups, in one place, for the front doors that keep them
(:func:`~kvviz.capture.loop.capture`, :meth:`~kvviz.engine.engine.Engine.submit`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from kvviz.capture.faults.base import Fault
from kvviz.capture.model_io import Sampling
from kvviz.capture.recorder import RecorderConfig


def _whole(value: object, least: int) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= least


@dataclass(frozen=True)
class Feed:
    """How the prompt goes in. ``prompt_ids`` (already tokenized) replace the prompt's text;
    ``chat`` wraps the text in the model's chat template. ``prefill_chunk`` prompt tokens go through
    the model per prefill forward (0: the whole prompt at once; None: :data:`PREFILL_CHUNK` on the
    default cache, one forward with a :class:`CacheSetup`'s cache or fault, whose semantics may hang on
    forward boundaries). ``prefill_tokens``: only the first this many prompt tokens are the prefill
    (the recorder's prompt; ``after_step`` runs once after them, as step 0); the rest is fed
    ``tail_chunk`` tokens per forward, ``after_step`` after each (None: the whole prompt is the prefill).
    ``forced`` tokens are fed instead of the sampled ones while they last (teacher forcing; the run
    then stops with "forced")."""

    chat: bool = True
    prompt_ids: Sequence[int] | None = None  # kept as a tuple
    prefill_chunk: int | None = None
    prefill_tokens: int | None = None
    tail_chunk: int = 1
    forced: Sequence[int] | None = None  # kept as a tuple

    def __post_init__(self) -> None:
        for name in ("prompt_ids", "forced"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, tuple(int(i) for i in value))
        if self.prefill_chunk is not None and self.prefill_chunk < 0:
            raise ValueError("prefill_chunk must be 0 (one forward) or a positive number of tokens.")
        if not _whole(self.tail_chunk, 1):
            raise ValueError("tail_chunk must be a whole number of tokens, at least 1.")


@dataclass(frozen=True)
class Decode:
    """How tokens are picked and when the run ends: ``max_new_tokens`` at most, ``sampling`` (greedy by
    default), the model's end-of-sequence tokens (``stop_on_eos=False`` generates every one of
    ``max_new_tokens``: a timing lesson's fixed length), and ``should_stop``, the caller's cancellation
    token (any callable), read after every produced token."""

    max_new_tokens: int = 64
    sampling: Sampling = field(default_factory=Sampling)
    stop_on_eos: bool = True
    should_stop: Callable[[], bool] | None = None

    def __post_init__(self) -> None:
        if not _whole(self.max_new_tokens, 1):
            raise ValueError("max_new_tokens must be a whole number, at least 1.")
        self.sampling.validate()


@dataclass(frozen=True)
class Recording:
    """What the run keeps. ``on=False`` runs without a recorder (the Trace then has tokens, steps and
    timings but no attention summaries); ``cfg`` tunes the recorder; ``decode=False`` gives the recorder
    to the prefill forwards only. ``verify`` keeps what the equivalence check needs (every step's
    logits and attention outputs). ``keep_logprobs`` keeps the log-probabilities [vocab] behind every
    produced token; ``score_tokens`` keeps, for every fed position, the log-probability of the token
    that followed it (the forward must then return every fed position's logits)."""

    on: bool = True
    cfg: RecorderConfig | None = None
    decode: bool = True
    verify: bool = False
    keep_logprobs: bool = False
    score_tokens: bool = False

    def __post_init__(self) -> None:
        if self.verify and not self.on:
            raise ValueError("The equivalence check compares recorded attention outputs: it needs record=True.")


@dataclass(frozen=True)
class CacheSetup:
    """The cache the run decodes over. ``factory(lm)`` builds it (None: transformers' DynamicCache,
    which gives sliding-window layers where the config has them); ``after_step(cache, recorder, step)``
    runs after each forward that produced a token (an eviction policy compresses the cache there; after
    the whole prompt for the prefill); ``fault`` (:mod:`kvviz.capture.faults`) breaks this run's cached
    decoding on purpose (the debugger's zoo)."""

    factory: Callable | None = None
    after_step: Callable | None = None
    fault: Fault | None = None


# the notebook's flat keyword → (group, field)
FLAGS: dict[str, tuple[str, str]] = {
    **{f.name: ("feed", f.name) for f in fields(Feed)},
    **{f.name: ("decode", f.name) for f in fields(Decode)},
    "record": ("recording", "on"),
    "cfg": ("recording", "cfg"),
    "record_decode": ("recording", "decode"),
    "verify": ("recording", "verify"),
    "keep_logprobs": ("recording", "keep_logprobs"),
    "score_tokens": ("recording", "score_tokens"),
    "cache_factory": ("cache", "factory"),
    "after_step": ("cache", "after_step"),
    "fault": ("cache", "fault"),
}
GROUPS = {"feed": Feed, "decode": Decode, "recording": Recording, "cache": CacheSetup}


def options(**flags: Any) -> dict[str, Any]:
    """The groups :class:`~kvviz.capture.generation.Generation` takes, from flat keywords
    (``chat=False, max_new_tokens=8, record=False`` …; a ``sampling`` of None is greedy).
    An unknown keyword raises TypeError, as a misspelt argument would."""
    parts: dict[str, dict[str, Any]] = {name: {} for name in GROUPS}
    for key, value in flags.items():
        if key not in FLAGS:
            raise TypeError(f"Unknown generation option {key!r}.")
        if key == "sampling" and value is None:
            continue
        group, name = FLAGS[key]
        parts[group][name] = value
    return {name: GROUPS[name](**values) for name, values in parts.items()}
