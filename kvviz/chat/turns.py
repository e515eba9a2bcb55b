"""What one chat turn reused: prompt tokens from the cache and computed, and where the template changed history.

Turn n+1 can reuse turn n's cache only as far as its prompt repeats, token for token, what that cache
holds. :func:`turn_report` compares the new prompt with the previous turn's tokens (its prompt and
answer as generated) and finds the first position where they differ, with the text on both sides, so
a template that rewrites an earlier turn shows where it did. The counts come from the run's Trace:
``cached_prompt_tokens`` (reused; a tiered store may later split it by where the blocks were) and the
rest of the prompt (computed); ``turn_cached_tokens`` of the previous turn is what the store kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from kvviz.capture.tokens import token_texts
from kvviz.capture.trace import Trace

CONTEXT_TOKENS = 6  # tokens of text shown on each side of the first difference


@dataclass(frozen=True)
class TurnReport:
    """One turn's reuse: ``reused`` + ``computed`` = ``prompt_tokens``; ``diverged`` is the first position
    where the new prompt differs from the previous turn's tokens (None: it repeats all of them), with
    ``before`` (the text both share just before it), ``was`` (what the previous turn had there) and ``now``
    (what the new prompt has)."""

    turn: int
    prompt_tokens: int
    reused: int
    computed: int
    previous_tokens: int  # tokens of the previous turn (prompt + answer); 0 for the first turn
    previous_cached: int  # of those, the leading tokens the prefix store kept (whole blocks)
    diverged: int | None
    kept: int = 0  # this turn's leading tokens (prompt + answer) the store kept for the next turn
    before: str = ""
    was: str = ""
    now: str = ""
    answered: bool = True  # False: the turn's answer has no text (its first token ended the turn)

    def as_dict(self) -> dict:
        return asdict(self)

    def verdict(self) -> str:
        """One line: what the turn reused and why it stopped there, and what it kept for the next turn."""
        out = f"{self._reuse()} The store kept this turn's first {self.kept:,} tokens (prompt and answer) for the next."
        if not self.answered:
            out += " The model answered nothing: the first token it chose ends its turn."
        return out

    def _reuse(self) -> str:
        head = f"Turn {self.turn}: {self.reused:,} of {self.prompt_tokens:,} prompt tokens reused, {self.computed:,} computed"
        if self.turn == 1 or not self.previous_tokens:
            return head + " (the first turn: only the template's blocks can be cached)."
        if self.diverged is not None and self.diverged < self.previous_tokens:
            return (
                head + f"; the prompt differs from the previous turn at position {self.diverged:,}: "
                "the template rendered the history differently, and nothing after that can be reused."
            )
        if self.reused < self.previous_cached:
            return head + "; the prompt repeats the previous turn, but its last token is always computed."
        return (
            head + f"; the prompt repeats the previous turn, whose first {self.previous_cached:,} tokens were cached."
        )


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first position where ``a`` and ``b`` differ, or where the shorter ends; None when equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def turn_report(tokenizer, trace: Trace, previous: Sequence[int], previous_cached: int, turn: int) -> TurnReport:
    """Turn ``turn``'s report from its Trace and the previous turn's tokens (``previous``: prompt and answer;
    empty for the first turn), of which the store kept ``previous_cached``."""
    n = trace.n_prompt
    prompt = trace.token_ids[:n]
    reused = trace.cached_prompt_tokens
    at = first_difference(previous, prompt) if previous else None
    if at is not None and at >= len(previous):  # the new prompt goes on after everything the turn had
        at = None
    before = was = now = ""
    if at is not None:
        lo = max(0, at - CONTEXT_TOKENS)
        before = "".join(token_texts(tokenizer, prompt[lo:at]))
        was = "".join(token_texts(tokenizer, list(previous[at : at + CONTEXT_TOKENS])))
        now = "".join(token_texts(tokenizer, prompt[at : at + CONTEXT_TOKENS]))
    kept = trace.turn_cached_tokens or 0
    answered = bool(trace.text.strip())
    return TurnReport(turn, n, reused, n - reused, len(previous), previous_cached, at, kept, before, was, now, answered)
