"""Generating with and without the KV cache on the real model: the same tokens, linear vs quadratic work.

Without a cache every step re-runs the whole sequence (the source article's redundant-work table);
with one, each step feeds one token. ``compare_cache`` measures both, greedy, step by step::

    from kvviz.models import load_model
    from kvviz.lessons.nocache import compare_cache, table_for_prompt
    lm = load_model()
    table_for_prompt(lm, "Once upon a time", steps=4)      # the article's table for your prompt
    compare_cache(lm, "Once upon a time", new_tokens=32).frame()   # time and passes vs N
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from kvviz.capture.drive import forwards
from kvviz.capture.generation import Generation
from kvviz.capture.model_io import encode_prompt
from kvviz.capture.options import Decode, Feed, Recording
from kvviz.capture.tokens import token_texts
from kvviz.examples import needle_passage
from kvviz.lessons.waste import forward_passes
from kvviz.models import LoadedModel

Progress = Callable[[float, str], None]


@dataclass(frozen=True)
class NoCacheSetting:
    """A ready setting of the Cache vs no cache view: prompt, chat template, tokens to generate."""

    label: str
    prompt: str
    chat: bool
    new_tokens: int


# The article's own prompt is a few tokens: each forward's fixed cost hides the waste in wall time (≈ 2×
# against ≈ 18× in passes). A ~300-token passage makes the re-run tokens, not the overhead, dominate;
# the Learn tab's show-me uses the same setting, so it is computed once at start-up and answers at once.
DRAMATIC = NoCacheSetting("Show the dramatic case: a ~300-token prompt", needle_passage(), False, 24)


@dataclass
class Run:
    """One greedy generation: the new token ids and, per step, wall time (s) and tokens fed (passes)."""

    cached: bool
    token_ids: list[int]
    step_seconds: list[float]
    step_passes: list[int]

    @property
    def cumulative_seconds(self) -> np.ndarray:
        return np.cumsum(self.step_seconds)

    @property
    def cumulative_passes(self) -> np.ndarray:
        return np.cumsum(self.step_passes)


def _check(ids: list[int], new_tokens: int) -> None:
    if not ids:
        raise ValueError("The prompt is empty: type some text.")
    if isinstance(new_tokens, bool) or not isinstance(new_tokens, int) or new_tokens < 1:
        raise ValueError(f"new_tokens must be a positive integer, got {new_tokens!r}.")


def generate_without_cache(lm: LoadedModel, ids: list[int], new_tokens: int, progress: Progress | None = None) -> Run:
    """Greedy, re-running the whole sequence at every step (``use_cache=False``: nothing is kept).

    This is the one loop here that does not go through the solo driver (:mod:`kvviz.capture.drive`),
    on purpose: a :class:`~kvviz.capture.generation.Generation` feeds only what its cache lacks, and
    this lesson times the model with no cache at all, every step recomputing the whole sequence.
    Giving it a cache that forgets and a feed of the whole sequence would add a cache's writes and
    the run's bookkeeping to each timed step, the very work the comparison must leave out.
    """
    _check(ids, new_tokens)
    seq, out, secs, passes = list(ids), [], [], []
    with torch.inference_mode():
        for step in range(new_tokens):
            t0 = time.perf_counter()
            x = torch.tensor([seq], device=lm.device)
            logits = lm.model(input_ids=x, use_cache=False, logits_to_keep=1).logits[0, -1]
            nxt = int(torch.argmax(logits))
            secs.append(time.perf_counter() - t0)
            passes.append(len(seq))
            out.append(nxt)
            seq.append(nxt)
            if progress is not None:
                progress(
                    (step + 1) / new_tokens,
                    f"Without a cache: step {step + 1}/{new_tokens} re-ran {len(seq) - 1} tokens",
                )
    return Run(False, out, secs, passes)


def generate_with_cache(lm: LoadedModel, ids: list[int], new_tokens: int, progress: Progress | None = None) -> Run:
    """Greedy with a DynamicCache: the prompt once (prefill), then one token per step — a run of the solo
    driver every one-at-a-time run uses (:func:`kvviz.capture.drive.forwards`), without a recorder or the
    capture's attention wrapper (the model's attention as loaded, as the uncached loop runs it)."""
    _check(ids, new_tokens)
    g = Generation(
        lm,
        "",
        feed=Feed(prompt_ids=ids, prefill_chunk=0),
        decode=Decode(max_new_tokens=new_tokens, stop_on_eos=False),
        recording=Recording(on=False),
    )
    secs, passes = [], []
    for f in forwards(lm, g, wrapped=False):
        secs.append(f.wall_s)
        passes.append(len(f.feed))
        if progress is not None:
            progress(g.step / new_tokens, f"With the cache: step {g.step}/{new_tokens}")
    return Run(True, g.trace.token_ids[len(ids) :], secs, passes)


@dataclass
class CacheComparison:
    """Both runs on one prompt; ``same_tokens`` is the check that the cache changes nothing but the work."""

    prompt_tokens: int
    new_tokens: int
    cached: Run
    uncached: Run

    @property
    def same_tokens(self) -> bool:
        return self.cached.token_ids == self.uncached.token_ids

    @property
    def speedup(self) -> float:
        return float(self.uncached.cumulative_seconds[-1] / self.cached.cumulative_seconds[-1])

    def frame(self) -> pd.DataFrame:
        """One row per N (tokens generated so far): measured seconds and passes, and the formula's passes."""
        n = np.arange(1, self.new_tokens + 1)
        fp = [forward_passes(self.prompt_tokens, int(k)) for k in n]
        return pd.DataFrame(
            {
                "N (tokens generated)": n,
                "time with cache (s)": self.cached.cumulative_seconds,
                "time without cache (s)": self.uncached.cumulative_seconds,
                "passes with cache": self.cached.cumulative_passes,
                "passes without cache": self.uncached.cumulative_passes,
                "formula with cache (L + N − 1)": [f.with_cache for f in fp],
                "formula without cache (NL + N(N−1)/2)": [f.without_cache for f in fp],
            }
        )


def compare_cache(
    lm: LoadedModel,
    prompt: str,
    new_tokens: int = 32,
    chat: bool = False,
    ids: list[int] | None = None,
    progress: Progress | None = None,
) -> CacheComparison:
    """Generate ``new_tokens`` greedily with and without the cache (no early stop, so both make N tokens)."""
    ids = list(ids) if ids is not None else encode_prompt(lm, prompt, chat)
    _check(ids, new_tokens)

    def part(lo: float, hi: float) -> Progress | None:
        return None if progress is None else (lambda f, desc: progress(lo + (hi - lo) * f, desc))

    cached = generate_with_cache(lm, ids, new_tokens, part(0.0, 0.2))
    uncached = generate_without_cache(lm, ids, new_tokens, part(0.2, 1.0))
    return CacheComparison(len(ids), new_tokens, cached, uncached)


# ---- the article's table and the chapter's example -----------------------------------------------
def redundant_work_table(tokens: list[str], n_prompt: int, steps: int | None = None) -> pd.DataFrame:
    """The article's "Repeated work without a cache" table for any token strings.

    Step 1 processes the prompt's ``n_prompt`` tokens; step s re-runs the prompt plus s − 1 generated
    tokens, recomputing K/V for all of them although only the newest one is new.
    """
    if n_prompt < 1 or n_prompt > len(tokens):
        raise ValueError(f"n_prompt must be between 1 and {len(tokens)}, got {n_prompt}.")
    steps = len(tokens) - n_prompt + 1 if steps is None else steps
    if steps < 1 or n_prompt + steps - 1 > len(tokens):
        raise ValueError(f"{steps} steps need {n_prompt + steps - 1} tokens, only {len(tokens)} given.")
    rows = []
    for s in range(1, steps + 1):
        n = n_prompt + s - 1
        rows.append(
            {
                "Step": s,
                "Input sequence": "".join(tokens[:n]).strip(),
                "Keys and Values computed": f"K/V for tokens 1–{n}",
                "Redundant work": "None" if s == 1 else f"Tokens 1–{n - 1}",
                "With a KV cache": f"K/V for tokens 1–{n}" if s == 1 else f"K/V for token {n} only",
                "K/V computed (tokens)": n,
                "redundant (tokens)": 0 if s == 1 else n - 1,
            }
        )
    return pd.DataFrame(rows)


def table_for_prompt(lm: LoadedModel, prompt: str, steps: int = 4, chat: bool = False) -> pd.DataFrame:
    """The table for the user's prompt: real tokenizer, the model's own greedy continuation."""
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= 64:
        raise ValueError(f"steps must be an integer in 1…64, got {steps!r}.")
    ids = encode_prompt(lm, prompt, chat)
    _check(ids, 1)
    new = generate_with_cache(lm, ids, steps - 1).token_ids if steps > 1 else []
    tok = lm.tokenizer
    return redundant_work_table(token_texts(tok, ids + new), len(ids), steps)


def chapter_example(prompt_tokens: int = 1000, new_tokens: int = 1000) -> dict:
    """The chapter's 1,000 + 1,000 arithmetic (≈ 1.5 million vs ≈ 2,000 passes, ≈ 750×), from kvviz.lessons.waste."""
    fp = forward_passes(prompt_tokens, new_tokens)
    return {
        "prompt_tokens": prompt_tokens,
        "new_tokens": new_tokens,
        "with_cache": fp.chapter_with_cache,
        "without_cache": fp.chapter_without_cache,
        "ratio": fp.chapter_ratio,
        "exact_with_cache": fp.with_cache,
        "exact_without_cache": fp.without_cache,
        "exact_ratio": fp.ratio,
    }
