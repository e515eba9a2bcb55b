"""The Eviction view's figures: pure functions of a run, with the right shapes, labels and units."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kvviz.capture.model_io import encode_prompt
from kvviz.eviction.demos import NEEDLE_POLICIES
from kvviz.eviction.policies import make_policy
from kvviz.eviction.run import run_policy
from kvviz.figures import eviction as fig

pytestmark = pytest.mark.slow  # the figures draw real eviction runs

PROMPT = "The cat sat on the mat. Where did the cat sit?"


@pytest.fixture(scope="module")
def ids(lm):
    return encode_prompt(lm, PROMPT, True)


@pytest.fixture(scope="module")
def h2o_run(lm, ids):
    return run_policy(lm, ids, make_policy("h2o"), budget=10, max_new_tokens=4)


def test_token_strip_colours_every_fed_token(h2o_run, ids):
    strip = fig.token_strip(h2o_run, 29, 1, 0)
    assert [t for t, _ in strip] == h2o_run.tokens[: len(ids)]
    labels = [lab for _, lab in strip]
    assert labels.count("evicted") == len(ids) - 10
    assert labels.count("window") == 5 and labels.count("heavy hitter") == 5
    assert set(labels) <= set(fig.ROLE_COLORS)
    later = fig.token_strip(h2o_run, 29, 1, len(h2o_run.history) - 1)
    assert len(later) == len(ids) + len(h2o_run.history) - 1
    assert later[-1][1] == "window", "the newest token is in the recent window"


def test_kept_map_counts_kv_heads(h2o_run, ids):
    f = fig.kept_map(h2o_run, 0)
    z = np.array(f.data[0].z)
    assert z.shape == (30, len(ids))
    assert (z.sum(axis=1) == 3 * 10).all(), "each of the 3 KV heads keeps 10 positions per layer"
    assert f.layout.xaxis.title.text == "position (token index)"


def test_timeline_has_one_row_per_step(h2o_run):
    f = fig.timeline(h2o_run, 0, 0)
    z = np.array(f.data[0].z)
    assert z.shape == (len(h2o_run.history), len(h2o_run.tokens))
    first = fig.role_row(h2o_run, 0, 0, 0)
    assert (first[len(h2o_run.prompt_ids) :] == fig.NOT_SEEN).all()


def test_scores_and_slot_table(h2o_run, ids):
    f = fig.scores_figure(h2o_run, 3, 2, "accumulated attention")
    assert len(f.data[0].y) == len(ids) and f.layout.yaxis.title.text == "accumulated attention"
    by_position = fig.scores_figure(replace(h2o_run, prefill_scores=None), 3, 2)
    assert not by_position.data and "keeps entries by position" in by_position.layout.annotations[0].text
    assert by_position.layout.xaxis.visible is False  # no empty axes from -1 to 6
    table = fig.slot_table(h2o_run, 3, 2, 0)
    assert list(table.columns) == ["cache slot", "original position", "token", "role", "RoPE position"]
    assert table["cache slot"].tolist() == list(range(10))
    assert (table["RoPE position"] == table["original position"]).all(), "original-position mode"
    assert table["original position"].is_monotonic_increasing


def test_bad_selection_is_a_value_error(h2o_run):
    with pytest.raises(ValueError, match="layer"):
        fig.token_strip(h2o_run, 30, 0, 0)
    with pytest.raises(ValueError, match="step"):
        fig.kept_map(h2o_run, 99)


def test_every_view_has_a_caption():
    for key in ("strip", "map", "timeline", "scores", "budgets", "budget_bytes"):
        assert fig.CAPTIONS[key].endswith(".")


def test_the_needle_demo_says_which_policies_it_ran():
    """The tab ticks StreamingLLM, H2O and SnapKV; the demo runs two: its rows must say so and point to Compare."""
    text = fig.needle_scope(NEEDLE_POLICIES)
    assert text.startswith(
        "The needle demo runs StreamingLLM (sinks + recent) and SnapKV (observation-window votes) only"
    )
    assert "H2O" not in text and "**Compare**" in text
