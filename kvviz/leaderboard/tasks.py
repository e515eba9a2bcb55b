"""Retrieval tasks in RULER's style, generated from text shipped with kvviz (nothing is downloaded).

Three tasks, each a haystack with a needle at a chosen depth (0 % = the first sentence, 100 % = the
last) and a question after it:

- ``niah_single``: RULER's ``niah_single_1`` — one needle "One of the special magic numbers for
  {key} is: {value}." in a haystack of repeated noise sentences;
- ``niah_multikey``: RULER's ``niah_multikey_1`` — the same needle among distractor needles with
  other keys; only the asked key's value is right;
- ``passkey``: the passkey retrieval of Mohtashami & Jaggi 2023 — "The pass key is {value}.
  Remember it. {value} is the pass key." in the same noise.

Values are 7-digit numbers (RULER), keys words from a fixed list; a seed fixes everything. The
prompt is sized to a target length in tokens through the model's chat template; the question part
(question, end of turn, the assistant's answer prefix) is what a query-agnostic run feeds after
compressing the context. Usage::

    from kvviz.leaderboard.tasks import make_samples
    samples = make_samples(lm, ["niah_single"], lengths=[1024], n=5)
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from kvviz.capture.model_io import encode_prompt
from kvviz.models import LoadedModel

TASKS = ("niah_single", "niah_multikey", "passkey")
LENGTHS = (512, 1024, 2048)
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
KEYS = [
    "apple",
    "river",
    "candle",
    "falcon",
    "garden",
    "helmet",
    "island",
    "jacket",
    "kettle",
    "lantern",
    "meadow",
    "needle",
    "orchid",
    "pepper",
    "quartz",
    "ribbon",
    "saddle",
    "tunnel",
    "velvet",
    "walnut",
    "yogurt",
    "zipper",
    "anchor",
    "bamboo",
    "canyon",
    "dolphin",
    "engine",
    "forest",
    "glacier",
    "harbor",
]
DISTRACTORS = 3  # other needles in niah_multikey
NIAH_INTRO = (
    "Some special magic numbers are hidden within the following text. Make sure to memorize it. I will quiz "
    "you about the numbers afterwards."
)
PASSKEY_INTRO = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. I will "
    "quiz you about the important information there."
)


@dataclass(frozen=True)
class Sample:
    """One generated prompt: token ids, where the question starts, where the needle's value sits, the answer."""

    task: str
    length: int  # target length in tokens
    depth: float  # needle depth, 0 … 1
    seed: int
    ids: list[int]
    n_context: int  # tokens before the question part (what a query-agnostic run compresses)
    needle_span: tuple[int, int]  # [start, stop) token positions of the needle sentence
    value_span: tuple[int, int]  # [start, stop) token positions of the value inside it
    answers: list[str]  # every string the answer must contain (kvpress's string_match_all)
    context: str  # the text before the question (the Eviction tab's Context box)
    question: str  # the question text (the Eviction tab's Question box)

    @property
    def key(self) -> str:
        return f"{self.task}/{self.length}/{self.depth:.2f}/{self.seed}"


def _needle(task: str, key: str, value: str) -> str:
    if task == "passkey":
        return f"The pass key is {value}. Remember it. {value} is the pass key."
    return f"One of the special magic numbers for {key} is: {value}."


def _question(task: str, key: str) -> tuple[str, str]:
    """(question, answer prefix)."""
    if task == "passkey":
        return "What is the pass key?", "The pass key is"
    return (
        f"What is the special magic number for {key} mentioned in the provided text?",
        f"The special magic number for {key} mentioned in the provided text is",
    )


def _text(intro: str, sentences: list[str]) -> str:
    return intro + "\n" + " ".join(sentences)


def make_sample(lm: LoadedModel, task: str, length: int, depth: float, seed: int) -> Sample:
    """One sample of ``task`` whose prompt is at most ``length`` tokens (as close as whole noise sentences allow)."""
    if task not in TASKS:
        raise ValueError(f"Unknown task {task!r}; choose from {', '.join(TASKS)}.")
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be between 0 and 1, got {depth}.")
    rng = random.Random(f"{task}-{length}-{depth}-{seed}")
    keys = rng.sample(KEYS, DISTRACTORS + 1)
    value = str(rng.randint(1_000_000, 9_999_999))
    needle = _needle(task, keys[0], value)
    others = (
        [_needle(task, k, str(rng.randint(1_000_000, 9_999_999))) for k in keys[1:]] if task == "niah_multikey" else []
    )
    question, prefix = _question(task, keys[0])
    intro = PASSKEY_INTRO if task == "passkey" else NIAH_INTRO
    tok = lm.tokenizer

    def build(n_noise: int) -> tuple[list[str], int]:
        sentences = [NOISE] * n_noise
        for d in others:  # distractors at their own random depths
            sentences.insert(rng_d.randint(0, len(sentences)), d)
        at = round(depth * len(sentences))
        sentences.insert(at, needle)
        return sentences, at

    def ids_for(context: str) -> list[int]:
        ids = encode_prompt(lm, f"{context}\n\n{question}", chat=True)
        return ids + tok(prefix, add_special_tokens=False)["input_ids"]

    lo, hi = 0, max(1, length // 8)
    while lo < hi:  # the most noise sentences that fit
        mid = (lo + hi + 1) // 2
        rng_d = random.Random(f"{seed}-distractors")
        if len(ids_for(_text(intro, build(mid)[0]))) <= length:
            lo = mid
        else:
            hi = mid - 1
    rng_d = random.Random(f"{seed}-distractors")
    sentences, _ = build(lo)
    context = _text(intro, sentences)
    ids = ids_for(context)
    n_context = _common_prefix(ids, encode_prompt(lm, context, chat=True))
    needle_span = _find(tok, ids, context, needle, lm)
    value_span = _find(tok, ids, context, value, lm, within=needle_span)
    return Sample(
        task, length, float(depth), seed, ids, n_context, needle_span, value_span, [value], context, f"{question}"
    )


def _common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _find(
    tok, ids: list[int], context: str, text: str, lm: LoadedModel, within: tuple[int, int] | None = None
) -> tuple[int, int]:
    """[start, stop) token positions covering ``text``'s first occurrence (inside ``within`` if given)."""
    lo, hi = within if within is not None else (0, len(ids))
    pieces = [tok.decode([i]) for i in ids]
    starts, pos = [], 0
    for p in pieces:
        starts.append(pos)
        pos += len(p)
    joined = "".join(pieces)
    at = joined.find(text, starts[lo] if lo < len(starts) else 0)
    if at < 0:
        raise ValueError(f"{text[:30]!r} is not in the prompt's tokens.")
    end = at + len(text)
    first = max(i for i in range(len(ids)) if starts[i] <= at)
    last = max(i for i in range(len(ids)) if starts[i] < end)
    if not lo <= first <= last < hi:
        raise ValueError(f"{text[:30]!r} is not where it was expected in the prompt.")
    return first, last + 1


def depths(n: int) -> list[float]:
    """``n`` needle depths spread evenly over 0 … 100 %."""
    return [0.0] if n <= 1 else [i / (n - 1) for i in range(n)]


def make_samples(lm: LoadedModel, tasks: list[str], lengths: list[int], n: int, seed: int = 0) -> list[Sample]:
    """``n`` samples per (task, length), needle depths spread over 0–100 %, seeds from ``seed``."""
    out = []
    for task in tasks:
        for length in lengths:
            for i, d in enumerate(depths(n)):
                out.append(make_sample(lm, task, length, d, seed + i))
    return out


def string_match_all(prediction: str, answers: list[str]) -> float:
    """kvpress's (RULER's) string_match_all for one sample: the share of answers found in the prediction, any case."""
    return sum(a.lower() in prediction.lower() for a in answers) / len(answers)
