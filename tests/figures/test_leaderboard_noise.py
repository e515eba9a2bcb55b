"""The Leaderboard says how far 25 samples can be trusted: a 95 % interval per point, a sentence where a policy
scores above the full cache, and PyramidKV's line still visible where it lies under SnapKV's (stored result)."""

from __future__ import annotations

import json

import gradio as gr
import numpy as np
import pytest

from kvviz.figures import leaderboard as fig
from kvviz.leaderboard import results
from kvviz.settings import Settings
from kvviz.ui import leaderboard as tab_leaderboard
from kvviz.ui.eviction import tab as tab_eviction
from kvviz.ui.serving.context import AppContext


@pytest.fixture(scope="module")
def stored() -> dict:
    data = results.load_result(results.DEFAULT_RESULT)
    assert data is not None
    return data


def test_wilsons_interval_solves_its_quadratic():
    # the bounds are the p where (k/n − p)² = z² p (1 − p) / n
    for k, n in ((19, 25), (21, 25), (0, 25), (25, 25), (1, 3)):
        z, q = results.Z95, k / n
        roots = np.sort(np.roots([1 + z * z / n, -(2 * q + z * z / n), q * q]).real)
        assert results.wilson_interval(k, n) == pytest.approx(tuple(np.clip(roots, 0, 1)), abs=1e-9)


def test_every_stored_point_has_its_interval_on_the_chart(stored):
    table = results.table(stored)
    figure = fig.curves(table, "string_match", "query_aware")
    aware = table[table["mode"] == "query_aware"].sort_values(["policy", "ratio"])
    for trace in figure.data:
        rows = aware[aware["policy"] == trace.name]
        n = rows["samples"].to_numpy()
        bounds = [results.wilson_interval(round(s * k), k) for s, k in zip(rows["string_match"], n)]
        assert np.allclose(np.array(trace.y) + np.array(trace.error_y.array), [100 * hi for _, hi in bounds])
        assert np.allclose(np.array(trace.y) - np.array(trace.error_y.arrayminus), [100 * lo for lo, _ in bounds])
    points = fig.points_table(table, "query_aware")
    assert (
        points.loc[(points["policy"] == "kvzip") & (points["requested ratio"] == 0.75)].iloc[0][
            "string match 95 % interval"
        ]
        == "65–94"
    )


def test_kvzip_above_the_full_cache_is_said_to_be_within_the_noise(stored, lm):
    table = results.table(stored)
    note = fig.above_full_note(table)
    assert (
        "**KVzip above the full cache?** At r = 0.75 and 0.875 (query-aware) it scores 84 % against the full " in note
    )
    assert "21 against 19 of 25 samples, 2 samples apart" in note and "57–89 % for the full cache" in note
    assert "within the noise" in note
    ctx = AppContext(lm=lm, settings=Settings(max_new_tokens=16))
    with gr.Blocks() as demo, gr.Tabs() as ctx.tabs:
        with gr.Tab("Eviction", id="tab_eviction"):
            tab_eviction.build(ctx)
        with gr.Tab("Leaderboard", id="tab_leaderboard"):
            tab_leaderboard.build(ctx)
    by_id = {getattr(b, "elem_id", None): b for b in demo.blocks.values()}
    assert by_id["lb-above-full"].value == note
    drawn = json.loads(by_id["lb-curves"].value["plot"])["data"]
    assert all("error_y" in t for t in drawn)


def test_pyramidkv_stays_visible_where_it_lies_under_snapkv(stored):
    table = results.table(stored)
    traces = {t.name: t for t in fig.curves(table, "string_match", "query_aware").data}
    pyramid, snap = traces["pyramidkv"], traces["snapkv"]
    assert any(a == b for a, b in zip(pyramid.y[1:], snap.y[1:]))  # they coincide in the stored sweep
    assert pyramid.line.dash != snap.line.dash and pyramid.marker.symbol != snap.marker.symbol
    names = [t.name for t in fig.curves(table, "string_match", "query_aware").data]
    under, over = (pyramid, snap) if names.index("pyramidkv") < names.index("snapkv") else (snap, pyramid)
    assert under.marker.size > over.marker.size  # the one drawn first is the larger marker
    assert len({(t.line.dash, t.marker.symbol) for t in traces.values()}) == len(traces)
