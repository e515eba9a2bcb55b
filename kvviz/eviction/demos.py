"""The two ready eviction demos: Needle (who keeps the fact?) and Sinks matter (perplexity without sinks).

Needle: a passage with one fact in the middle and a question at the end. StreamingLLM keeps only the
first and the latest tokens, so at a budget well under the passage it drops the fact; SnapKV keeps
it when the question sits in its observation window, and loses it when only the context is
compressed (the question is fed afterwards, uncompressed, so it cannot vote).

Sinks matter: perplexity token by token over a long text with a small cache, with and without the
first 4 tokens. The stream is fed through a :class:`~kvviz.eviction.cache.StreamingCache` in chunks
with a mask that gives every query exactly the keys a token-by-token streaming cache would hold
(original positions), so the numbers equal token-by-token decoding (a test checks it) at a
fraction of the time.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from kvviz.capture.drive import forwards
from kvviz.capture.generation import Generation
from kvviz.capture.model_io import encode_prompt
from kvviz.capture.options import CacheSetup, Decode, Feed, Recording
from kvviz.eviction.cache import EvictingCache, StreamingCache
from kvviz.eviction.compare import Comparison, compare
from kvviz.eviction.policies import make_policy
from kvviz.examples import NEEDLE_ANSWER, NEEDLE_QUESTION, chapter_text, needle_passage
from kvviz.models import LoadedModel

Progress = Callable[[float, str], None]

# The needle demo's settings, tuned on the bundled SmolLM2-135M-Instruct (fp32, CPU; see tests/eviction/test_run.py).
NEEDLE_FILLER = (8, 16)  # filler sentences before / after the fact
NEEDLE_BUDGET = 256  # tokens kept per layer and KV head (52 % of the 496-token prompt)
NEEDLE_POLICIES = ("streaming_llm", "snapkv")
SINKS_TOKENS = 1536  # tokens of the chapter scored in the Sinks demo (~20 s on 2 idle CPU cores)
SINKS_CACHE = 64  # cache size (entries per layer and KV head) in the Sinks demo


def join_question(context: str, question: str) -> str:
    """The prompt text: the context, a blank line, the question (how the needle prompt is written)."""
    return f"{context}\n\n{question}" if question.strip() else context


def split_question(lm: LoadedModel, context: str, question: str, chat: bool) -> tuple[list[int], int]:
    """Token ids of context + question and how many of them belong to the context.

    The split is where the tokens of the prompt stop matching those of the context alone, so a chat
    template's prefix counts as context and its closing tokens follow the question.
    """
    if not context.strip():
        raise ValueError("The context is empty: paste a passage to compress.")
    ids = encode_prompt(lm, join_question(context, question), chat)
    if not question.strip():
        return ids, len(ids)
    alone = encode_prompt(lm, context, chat)
    n = next((i for i, (a, b) in enumerate(zip(ids, alone)) if a != b), min(len(ids), len(alone)))
    return ids, max(n, 1)


@dataclass
class NeedleResult:
    comparison: Comparison
    compress_question: bool
    n_context: int

    def found(self) -> dict[str, bool]:
        """Policy name → whether its answer contains the fact."""
        return {r.policy.name: NEEDLE_ANSWER in r.run.text for r in self.comparison.results}


def needle_demo(
    lm: LoadedModel,
    *,
    compress_question: bool = True,
    budget: int = NEEDLE_BUDGET,
    policies: tuple[str, ...] = NEEDLE_POLICIES,
    max_new_tokens: int = 14,
    progress: Progress | None = None,
) -> NeedleResult:
    """Full cache vs StreamingLLM vs SnapKV on the needle passage (chat template on)."""
    ids, n_context = split_question(lm, needle_passage(*NEEDLE_FILLER), f"Question: {NEEDLE_QUESTION}", True)
    cmp = compare(
        lm,
        ids,
        [make_policy(p) for p in policies],
        budget=budget,
        n_compress=None if compress_question else n_context,
        max_new_tokens=max_new_tokens,
        progress=progress,
    )
    return NeedleResult(cmp, compress_question, n_context)


def streaming_nll(
    lm: LoadedModel,
    ids: list[int],
    cache_size: int | None,
    sinks: int,
    chunk: int = 128,
    progress: Progress | None = None,
) -> np.ndarray:
    """Negative log-likelihood (nats) of ids[1:], each token predicted from a streaming cache.

    ``cache_size`` entries are held between steps (``sinks`` first tokens + the latest ones; None =
    the full cache); each query sees them plus itself, as in token-by-token decoding. The stream is
    a teacher-forced run of the solo driver (:func:`kvviz.capture.drive.forwards`): ids[:-1] fed
    ``chunk`` tokens per forward (the cache trimmed after each), ids[-1] forced, every fed position scored.
    """
    if cache_size is not None and not 0 <= sinks < cache_size:
        raise ValueError(f"The cache ({cache_size}) must hold more than the {sinks} sinks.")

    def cache_factory(model: LoadedModel) -> EvictingCache:
        if cache_size is None:
            return EvictingCache(model.config)
        return StreamingCache(model.config, sinks, cache_size - sinks)

    g = Generation(
        lm,
        "",
        feed=Feed(prompt_ids=ids[:-1], forced=ids[-1:], prefill_tokens=min(chunk, len(ids) - 1), tail_chunk=chunk),
        decode=Decode(max_new_tokens=1),
        recording=Recording(on=False, score_tokens=True),
        cache=CacheSetup(
            factory=cache_factory, after_step=None if cache_size is None else (lambda cache, _rec, _step: cache.trim())
        ),
    )
    n = len(ids) - 1
    for _ in forwards(lm, g):
        if progress is not None:
            progress(min(g.fed, n) / n, "")
    return -torch.cat(g.token_logprobs).numpy()


@dataclass
class SinksResult:
    frame: pd.DataFrame  # position, then one NLL column (nats) per variant
    perplexity: dict[str, float]  # variant → perplexity over the tokens after the cache first filled
    cache_size: int
    sinks: int


def sinks_demo(
    lm: LoadedModel,
    *,
    text: str | None = None,
    n_tokens: int = SINKS_TOKENS,
    cache_size: int = SINKS_CACHE,
    sinks: int = 4,
    progress: Progress | None = None,
) -> SinksResult:
    """Perplexity of the first ``n_tokens`` of the chapter: full cache, sinks + window, window only."""
    ids = lm.tokenizer(text if text is not None else chapter_text())["input_ids"][:n_tokens]
    if len(ids) <= cache_size + 1:
        raise ValueError(
            f"The text has {len(ids)} tokens; it needs more than the cache ({cache_size}) to show anything."
        )
    variants = [
        ("full cache", None, 0),
        (f"{sinks} sinks + {cache_size - sinks} recent", cache_size, sinks),
        (f"{cache_size} recent, no sinks", cache_size, 0),
    ]
    cols = {"position": np.arange(1, len(ids))}
    for i, (name, size, s) in enumerate(variants):

        def step(f: float, _d: str, i=i, name=name) -> None:
            if progress is not None:
                progress((i + f) / len(variants), name)

        cols[name] = streaming_nll(lm, ids, size, s, progress=step)
    frame = pd.DataFrame(cols)
    after = frame["position"] > cache_size
    ppl = {name: float(math.exp(frame.loc[after, name].mean())) for name, _, _ in variants}
    return SinksResult(frame, ppl, cache_size, sinks)
