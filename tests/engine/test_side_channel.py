"""The side channel a shared prefix store opens, and the salt that closes it."""

from __future__ import annotations

import pytest

from kvviz.capture.model_io import encode_prompt
from kvviz.engine.side_channel import Leak, measure
from kvviz.examples import chapter_text
from kvviz.figures.prefix_tiers import leak_chart


def _leak(shared_sent: list[float], shared_new: list[float], salted_sent: list[float], salted_new: list[float]) -> Leak:
    times = {
        Leak.key(False, True): shared_sent,
        Leak.key(False, False): shared_new,
        Leak.key(True, True): salted_sent,
        Leak.key(True, False): salted_new,
    }
    return Leak(prompt_tokens=100, tries=len(shared_sent), times=times)


def test_the_guess_is_right_when_hits_are_fast_and_a_coin_when_they_are_not():
    leak = _leak([0.1, 0.12, 0.09], [1.0, 1.1, 0.9], [1.0, 0.95, 1.05], [1.0, 1.02, 0.98])
    assert leak.guessed_right(False) == 1.0
    assert leak.guessed_right(True) == 0.5  # every request looks new: the sent ones are all guessed wrong
    assert leak.median(False, True) == 0.1 and leak.median(True, False) == 1.0
    fig = leak_chart(leak)
    assert len(fig.data) == 4 and [round(y) for y in fig.data[0].y] == [100, 120, 90]  # milliseconds


@pytest.mark.slow
def test_measure_times_every_case_on_the_model(lm):
    ids = encode_prompt(lm, chapter_text(), False)[:36]
    leak = measure(lm, ids, tries=2)
    assert leak.prompt_tokens == 32 and leak.tries == 2
    assert sorted(leak.times) == ["salted-new", "salted-sent", "shared-new", "shared-sent"]
    assert all(len(v) == 2 and all(t > 0 for t in v) for v in leak.times.values())
    with pytest.raises(ValueError):
        measure(lm, ids[:10], tries=1)
