"""The sink map's "Look for" says what the chart shows on its show-me's run: the later layers' per-layer means of
attention on the first 4 tokens, how many heads pass half, and uniform's share — the numbers in the map's subtitle."""

from __future__ import annotations

import re

import pytest

from kvviz.capture.loop import capture
from kvviz.figures.sinks import layer_sink_line, sink_fraction, sink_map
from kvviz.lessons.objectives import SINKS

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trace(lm):
    v = SINKS.values
    return capture(lm, v["generate.prompt"], chat=v["generate.chat"], max_new_tokens=v["generate.max_new"])


def test_the_look_for_matches_the_chart(trace):
    frac = sink_fraction(trace, 4)  # [Lyr, Hq]
    later = frac[frac.shape[0] // 2 :]
    means = later.mean(1)
    uniform = float(layer_sink_line(trace, 4)["uniform"].mean())
    text = SINKS.look_for
    assert "most of their attention" not in text
    assert means.min() >= 0.25 and means.max() <= 2 / 3  # "between a quarter and two thirds ... layer by layer"
    assert (later < 0.5).sum() >= later.size / 4  # "with many heads under half"
    assert round(100 * uniform) == int(re.search(r"about (\d+) %", text).group(1))
    subtitle = sink_map(trace, 4).layout.title.text
    first = frac.shape[0] // 2
    assert (
        f"layers {first}–{frac.shape[0] - 1}: {100 * means.min():.0f}–{100 * means.max():.0f} % on average per "
        f"layer, {int((later > 0.5).sum())} of {later.size} heads above 50 %; uniform attention: {100 * uniform:.1f} %"
    ) in subtitle
