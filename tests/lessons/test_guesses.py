"""Predict, then reveal: every Learn question asks for a guess and judges it against the computed answer."""

from __future__ import annotations

import pytest

from kvviz.lessons.guesses import Guess, judge
from kvviz.lessons.questions import QUESTIONS

# what the chapter answers each question with, as the guess reads it off the computed values
CHAPTER = {0: 128.0, 1: "the same logits", 2: 2.0, 3: "evicted: it cannot", 4: "keys per channel"}


@pytest.mark.parametrize(
    "i", [pytest.param(i, marks=[pytest.mark.slow] if q.needs_model else []) for i, q in enumerate(QUESTIONS)]
)
def test_every_question_asks_for_a_guess_its_computed_answer_judges_right(request, i):
    q = QUESTIONS[i]
    assert isinstance(q.guess, Guess) and q.guess.prompt.startswith("Your guess:")
    values = q.compute(request.getfixturevalue("lm") if q.needs_model else None).values
    computed = q.guess.read(values)
    assert computed == CHAPTER[i], "the computed answer is the chapter's"
    if q.guess.is_number:
        assert judge(q.guess, computed, values).endswith("— right.")
    else:
        assert computed in q.guess.choices and len(q.guess.choices) == 2
        assert judge(q.guess, computed, values).endswith("— right.")
        other = next(c for c in q.guess.choices if c != computed)
        assert judge(q.guess, other, values).endswith("— not what the model shows.")


def test_a_number_guess_is_set_next_to_the_computed_value():
    q = QUESTIONS[0]  # Llama-3-8B bytes per token
    values = q.compute(None).values
    assert judge(q.guess, 40, values) == "**You guessed 40 KiB; kvviz computes 128 KiB** — off by 3.2× (too low)."
    assert judge(q.guess, 128, values).endswith("— right.")
    assert judge(q.guess, None, values) == "**No guess given.** kvviz computes **128 KiB**."


def test_a_choice_guess_is_judged_by_the_computed_answer():
    q = QUESTIONS[3]  # StreamingLLM and a fact 5,000 tokens back
    values = q.compute(None).values
    assert values["kept"] is False
    assert "— right." in judge(q.guess, q.guess.choices[1], values)
    assert "not what the model shows" in judge(q.guess, q.guess.choices[0], values)


def test_the_factor_reads_from_the_answer():
    g = Guess("factor?", lambda v: v["r"], "×")
    assert judge(g, 2, {"r": 2.0}) == "**You guessed 2×; kvviz computes 2×** — right."
    assert "too high" in judge(g, 40, {"r": 2.0})
