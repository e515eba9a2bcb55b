"""Predict, then reveal: a student's guess for a Learn question, set next to the answer kvviz computes.

Committing to a number or a choice before seeing the answer is what makes the answer stick; the
computed side is always read from the question's own :class:`~kvviz.lessons.questions.Answer`
values, never typed in.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

NUMBER_TOLERANCE = 0.05  # a numeric guess within 5 % of the computed value counts as right


@dataclass(frozen=True)
class Guess:
    """What to ask before revealing: a number (in ``unit``) or one of ``choices``; ``read`` gives kvviz's value."""

    prompt: str
    read: Callable[[dict[str, Any]], float | str]
    unit: str = ""
    choices: tuple[str, ...] = ()

    @property
    def is_number(self) -> bool:
        return not self.choices


def _number(x: float, unit: str) -> str:
    text = f"{x:,.0f}" if float(x).is_integer() else f"{x:,.1f}" if abs(x) >= 10 else f"{x:,.2f}"
    return f"{text} {unit}".strip() if unit not in ("×", "%") else f"{text}{unit}"


def judge(guess: Guess, given: object, values: dict[str, Any]) -> str:
    """One line for the page: the student's guess beside the computed value, and how close it was."""
    computed = guess.read(values)
    if guess.is_number:
        shown = _number(float(computed), guess.unit)
        try:
            g = float(given)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            g = math.nan
        if not math.isfinite(g):
            return f"**No guess given.** kvviz computes **{shown}**."
        if math.isclose(g, float(computed), rel_tol=NUMBER_TOLERANCE):
            verdict = "right"
        elif g > 0 and float(computed) > 0:
            ratio = max(g, float(computed)) / min(g, float(computed))
            verdict = f"off by {ratio:,.1f}× ({'too high' if g > float(computed) else 'too low'})"
        else:
            verdict = "not close"
        return f"**You guessed {_number(g, guess.unit)}; kvviz computes {shown}** — {verdict}."
    if given not in guess.choices:
        return f"**No guess given.** kvviz finds: **{computed}**."
    verdict = "right" if given == computed else "not what the model shows"
    return f"**You guessed “{given}”; kvviz finds “{computed}”** — {verdict}."
