"""Predict, then reveal: every Learn question asks for a guess and judges it against the computed answer."""

from __future__ import annotations

from kvviz.lessons.guesses import Guess, judge
from kvviz.lessons.questions import QUESTIONS


def test_every_question_asks_for_a_guess():
    assert all(q.guess is not None for q in QUESTIONS)


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
