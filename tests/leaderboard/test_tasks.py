"""The generated retrieval tasks: their length, where the needle is, and kvpress's string match."""

from __future__ import annotations

import pytest

from kvviz.leaderboard.tasks import TASKS, depths, make_sample, make_samples, string_match_all


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("length", [256, 512])
def test_a_sample_fits_its_length_and_its_spans_hold_the_needle(lm, task, length):
    s = make_sample(lm, task, length, 0.5, seed=3)
    assert length - 40 <= len(s.ids) <= length  # whole noise sentences: within one sentence of the target
    assert 0 < s.needle_span[0] <= s.value_span[0] < s.value_span[1] <= s.needle_span[1] < s.n_context < len(s.ids)
    value = lm.tokenizer.decode(s.ids[s.value_span[0] : s.value_span[1]]).strip()
    assert value == s.answers[0] and len(value) == 7 and value.isdigit()
    needle = lm.tokenizer.decode(s.ids[s.needle_span[0] : s.needle_span[1]])
    assert ("pass key" if task == "passkey" else "special magic number") in needle
    question = lm.tokenizer.decode(s.ids[s.n_context :])
    assert s.question in question and s.answers[0] not in question


def test_depth_moves_the_needle_and_a_seed_fixes_the_sample(lm):
    first, last = make_sample(lm, "niah_single", 512, 0.0, 0), make_sample(lm, "niah_single", 512, 1.0, 0)
    assert first.needle_span[0] < 60 < last.n_context - 60 < last.needle_span[0]
    assert make_sample(lm, "passkey", 256, 0.25, 7) == make_sample(lm, "passkey", 256, 0.25, 7)
    assert make_sample(lm, "passkey", 256, 0.25, 7).answers != make_sample(lm, "passkey", 256, 0.25, 8).answers


def test_multikey_has_distractor_needles_with_other_keys(lm):
    s = make_sample(lm, "niah_multikey", 512, 0.5, 1)
    assert s.context.count("One of the special magic numbers for") == 4
    key = s.question.split(" for ")[1].split(" mentioned")[0]
    assert s.context.count(f"numbers for {key} is") == 1


def test_samples_spread_depths_and_bad_requests_are_refused(lm):
    assert depths(5) == [0.0, 0.25, 0.5, 0.75, 1.0] and depths(1) == [0.0]
    samples = make_samples(lm, ["passkey", "niah_single"], [256], 3)
    assert [(s.task, s.depth) for s in samples] == [(t, d) for t in ("passkey", "niah_single") for d in (0, 0.5, 1)]
    with pytest.raises(ValueError, match="Unknown task"):
        make_sample(lm, "qa", 256, 0.5, 0)
    with pytest.raises(ValueError, match="depth"):
        make_sample(lm, "passkey", 256, 1.5, 0)


def test_string_match_all_is_kvpress_s():
    assert string_match_all("The pass key is 1234567.", ["1234567"]) == 1.0
    assert string_match_all("ABC and def", ["abc", "DEF", "ghi"]) == pytest.approx(2 / 3)
    assert string_match_all("nothing", ["1234567"]) == 0.0
