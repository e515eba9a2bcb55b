"""Shared set-up for the capture benchmarks: the repo on sys.path and a prompt of exactly N tokens."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from kvviz.examples import chapter_text  # noqa: E402
from kvviz.models import LoadedModel  # noqa: E402


def chapter_prompt_ids(tokenizer, n_tokens: int) -> list[int]:
    """The source chapter's tokens, repeated as often as needed and cut to exactly ``n_tokens``."""
    if n_tokens < 1:
        raise ValueError("n_tokens must be at least 1.")
    ids = [int(i) for i in tokenizer(chapter_text(), add_special_tokens=False)["input_ids"]]
    reps = -(-n_tokens // len(ids))
    return (ids * reps)[:n_tokens]


def never_stopping(lm: LoadedModel) -> LoadedModel:
    """The same model with no stop ids, so every run generates exactly the requested tokens."""
    return dataclasses.replace(lm, stop_ids=set())
