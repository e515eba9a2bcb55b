"""Leaderboard figures: one line per policy, the points and the samples behind one, from plain result data."""

from __future__ import annotations

import pandas as pd
import pytest

from kvviz.figures import leaderboard as fig


def fake_result() -> tuple[pd.DataFrame, pd.DataFrame]:
    """Records for 2 policies × 2 modes × ratios {0, 0.5} × 2 samples, and their table."""
    rows = []
    for policy in ("snapkv", "knorm"):
        for mode in ("query_aware", "query_agnostic"):
            for ratio in (0.0, 0.5):
                for i in range(2):
                    hit = float(ratio == 0.0 or (policy == "snapkv" and mode == "query_aware"))
                    rows.append(
                        {
                            "sample": f"passkey/512/{i / 2:.2f}/{i}",
                            "task": "passkey",
                            "length": 512,
                            "depth": i / 2,
                            "policy": policy,
                            "mode": mode,
                            "ratio": ratio,
                            "answer": "1234567",
                            "string_match": hit,
                            "needle_retention": 1 - ratio / 2,
                            "top1_agreement": hit,
                            "mean_kl": ratio,
                            "achieved_ratio": ratio * 0.9,
                            "achieved_ratio_held": ratio,
                        }
                    )
    records = pd.DataFrame(rows)
    metrics = ["string_match", "needle_retention", "top1_agreement", "mean_kl", "achieved_ratio", "achieved_ratio_held"]
    table = records.groupby(["policy", "mode", "ratio"], as_index=False)[metrics].mean()
    return table.assign(samples=2), records


@pytest.mark.parametrize("metric", list(fig.METRIC_LABELS))
def test_curves_draw_one_line_per_policy(metric):
    table, _ = fake_result()
    figure = fig.curves(table, metric, "query_aware")
    assert sorted(t.name for t in figure.data) == ["knorm", "snapkv"]
    snap = next(t for t in figure.data if t.name == "snapkv")
    assert list(snap.x) == [0.0, 0.5]
    scale = 100 if metric in fig.PERCENT else 1
    assert list(snap.y) == [
        v * scale
        for v in table[(table.policy == "snapkv") & (table["mode"] == "query_aware")].sort_values("ratio")[metric]
    ]
    achieved = fig.curves(table, metric, "query_aware", x="achieved_ratio")
    assert list(next(t for t in achieved.data if t.name == "snapkv").x) == [0.0, 0.45]


def test_the_modes_differ_where_the_question_votes():
    table, _ = fake_result()
    aware = next(t for t in fig.curves(table, "string_match", "query_aware").data if t.name == "snapkv")
    agnostic = next(t for t in fig.curves(table, "string_match", "query_agnostic").data if t.name == "snapkv")
    assert list(aware.y) == [100, 100] and list(agnostic.y) == [100, 0]


def test_points_and_samples_tables():
    table, records = fake_result()
    points = fig.points_table(table, "query_agnostic")
    assert len(points) == 4 and set(points["policy"]) == {"snapkv", "knorm"}
    assert points.loc[points["requested ratio"] == 0.5, "achieved (stored)"].tolist() == [0.45, 0.45]
    samples = fig.samples_table(records, "knorm", 0.5, "query_aware")
    assert len(samples) == 2 and list(samples["match"]) == [0.0, 0.0]
    assert fig.samples_table(records, "knorm", 0.25, "query_aware").empty


def test_bad_choices_are_refused():
    table, _ = fake_result()
    with pytest.raises(ValueError, match="metric"):
        fig.curves(table, "accuracy")
    with pytest.raises(ValueError, match="x must be"):
        fig.curves(table, "string_match", x="bytes")


def test_snapkv_is_reconciled_with_the_needle_demo():
    """The stored sweep's SnapKV: 4–8 % string match from r = 0.25, 78 % of the needle kept at 0.5 (aware)."""
    from kvviz.eviction.demos import NEEDLE_BUDGET
    from kvviz.examples import NEEDLE_ANSWER

    rows = [("query_aware", 0.0, 0.76, 1.0), ("query_aware", 0.25, 0.08, 0.88), ("query_aware", 0.5, 0.04, 0.78)]
    rows += [("query_agnostic", 0.25, 0.08, 0.82), ("query_agnostic", 0.875, 0.08, 0.25)]
    table = pd.DataFrame(
        [{"policy": "snapkv", "mode": m, "ratio": r, "string_match": s, "needle_retention": n} for m, r, s, n in rows]
    )
    text = fig.needle_vs_demo(table)
    assert "[needle demo](?tab=eviction)" in text and "answers only 4–8 % of these samples" in text
    assert "holds 78 % of the needle's entries at r = 0.5" in text and "first digits" in text
    assert f"keeping {NEEDLE_BUDGET} tokens, it keeps the code {NEEDLE_ANSWER}" in text
    assert fig.needle_vs_demo(table.assign(policy="knorm")) is None  # no SnapKV in the sweep: nothing to say
