"""Sinks on the bundled model: the measured pattern (first tokens soak up attention in later layers,
with small keys and values), and the arithmetic that turns column sums into sink fractions.

Measured on SmolLM2-135M-Instruct (fp32 CPU), chat question + 16 tokens, k = 4: layers 0–1 stay near
the uniform baseline (~0.2 vs 0.23); layers 3–9 and 12–29 put 0.43–0.91 of each query's attention on
the first 4 tokens (almost all of it on position 0); layers 10–11 do not (~0.2). In layers ≥ 12 the
first token's keys have ~1/4 and its values ~1/5 of the other tokens' norms.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvviz.capture.loop import capture
from kvviz.examples import needle_passage
from kvviz.sinks import (
    group_text,
    kv_groups,
    kv_head_of,
    layer_sink_line,
    learned_sink_fraction,
    sink_fraction,
    sink_frame,
    sink_norms,
    top_received,
    uniform_fraction,
)

pytestmark = pytest.mark.slow  # the tests read real captures of the bundled model

LATER = slice(12, None)


@pytest.fixture(scope="module", params=["chat", "plain"])
def trace(request, lm):
    if request.param == "chat":
        return capture(lm, "What is the capital of France?", chat=True, max_new_tokens=16)
    return capture(lm, needle_passage(3, 3), chat=False, max_new_tokens=16)


def test_later_layers_put_far_more_than_uniform_attention_on_the_first_tokens(trace):
    line = layer_sink_line(trace, 4)
    uniform = line["uniform"].iloc[0]
    later = line["mean"].to_numpy()[LATER]
    assert uniform < 0.3
    assert later.mean() > 2.5 * uniform  # measured ~3×
    assert (later > 1.5 * uniform).all()  # every later layer, measured ≥ 2×
    assert (line["mean"].to_numpy()[:2] < 1.5 * uniform).all()  # the first two layers do not sink


def test_the_sink_is_the_first_token(trace):
    one, four = sink_fraction(trace, 1)[LATER], sink_fraction(trace, 4)[LATER]
    assert one.mean() > 0.8 * four.mean()  # nearly all the first-4 mass sits on position 0
    assert top_received(trace, 3, LATER)["position"].iloc[0] == 0


def test_sink_keys_and_values_are_small(trace):
    norms = sink_norms(trace, 1).iloc[LATER]
    assert (norms["value_sink"] / norms["value_other"]).mean() < 0.5  # measured ~0.2
    assert (norms["key_sink"] / norms["key_other"]).mean() < 0.6  # measured ~0.26


def test_fraction_from_column_sums_equals_the_per_query_sink_mass(trace):
    # the recorder also kept, for k = sink_k, each query's own mass on the first tokens
    k = trace.sink_k
    per_query = trace.sink_mass[..., k:].mean(-1)
    assert np.allclose(sink_fraction(trace, k), per_query, atol=1e-5)


def test_uniform_baseline_matches_a_direct_average():
    # queries at positions 2, 3, 4 see 3, 4, 5 tokens; uniform attention gives 2/3, 2/4, 2/5 to the first 2
    assert uniform_fraction(5, 2) == pytest.approx(np.mean([2 / 3, 2 / 4, 2 / 5]))


def test_table_is_layers_by_heads_in_percent(trace):
    df = sink_frame(trace, 4)
    m = trace.model
    assert list(df.columns) == ["layer"] + [f"q{h}" for h in range(m.q_heads)]
    assert len(df) == m.layers
    assert np.allclose(df.iloc[:, 1:].to_numpy(), np.round(sink_fraction(trace, 4) * 100, 1))


@pytest.mark.parametrize("bad", [0, -1, 2.5, "x", 10_000])
def test_bad_k_is_refused(trace, bad):
    with pytest.raises(ValueError, match="k must be|whole number"):
        sink_fraction(trace, bad)


def test_kv_groups_follow_the_model(trace):
    info = trace.model  # SmolLM2: 9 query heads in 3 groups of 3
    assert kv_groups(info) == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert [kv_head_of(info, h) for h in (0, 4, 8)] == [0, 1, 2]
    assert "shared with query heads 3, 5" in group_text(info, 4)
    with pytest.raises(ValueError):
        kv_head_of(info, 9)


def test_learned_sinks_are_counted_apart_from_the_first_tokens():
    # gpt-oss: each head's learned sink logit takes part of every row; with one new token every fed query
    # is a prompt query, whose exact rows the trace keeps, so both fractions can be read off directly
    from kvviz.figures import sinks as fs
    from tests.tiny_models import tiny_model

    trace = capture(tiny_model("gpt_oss"), "", prompt_ids=list(range(100, 124)), max_new_tokens=1)
    k = 4
    rows = trace.window_rows.astype(np.float64)  # [Lyr, Hq, L, L]
    np.testing.assert_allclose(sink_fraction(trace, k), rows[:, :, k:, :k].sum(-1).mean(-1), atol=1e-6)
    learned = learned_sink_fraction(trace, k)
    np.testing.assert_allclose(learned, 1 - rows[:, :, k:].sum(-1).mean(-1), atol=1e-6)
    assert learned.min() > 0.01
    assert np.allclose(layer_sink_line(trace, k)["learned"], learned.mean(1))
    panels = fs.sink_map(trace, k)
    assert [t.type for t in panels.data] == ["heatmap", "heatmap"] and "learned sink" in panels.layout.title.text
    assert "learned sink" in [t.name for t in fs.sink_line(trace, k).data]


def test_models_without_learned_sinks_have_no_learned_share(trace):
    assert learned_sink_fraction(trace, 4) is None and "learned" not in layer_sink_line(trace, 4)
