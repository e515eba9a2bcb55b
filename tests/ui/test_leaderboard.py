"""Leaderboard tab: it loads a stored sweep at once, lists a point's samples, and opens one in the Eviction tab."""

from __future__ import annotations

import base64
import json

import gradio as gr
import numpy as np
import pytest

from kvviz.leaderboard import results
from kvviz.settings import Settings
from kvviz.ui import leaderboard as tab_leaderboard
from kvviz.ui.eviction import tab as tab_eviction
from kvviz.ui.serving.context import AppContext
from tests.figures.test_leaderboard import fake_result


@pytest.fixture
def stored(tmp_path, monkeypatch):
    table, records = fake_result()
    samples = [
        {
            "key": k,
            "task": "passkey",
            "length": 512,
            "depth": 0.5,
            "seed": 0,
            "n_tokens": 500,
            "n_context": 480,
            "needle_span": [240, 260],
            "value_span": [245, 252],
            "answers": ["1234567"],
            "context": "noise ... The pass key is 1234567. ...",
            "question": "What is the pass key?",
        }
        for k in sorted(set(records["sample"]))
    ]
    data = {
        "config": {
            "policies": ["snapkv", "knorm"],
            "ratios": [0.0, 0.5],
            "modes": ["query_aware", "query_agnostic"],
            "model": "SmolLM2",
            "dtype": "float32",
            "device": "cpu",
        },
        "timings": {"total_s": 12.0},
        "samples": samples,
        "records": records.to_dict(orient="records"),
        "table": table.to_dict(orient="records"),
    }
    path = tmp_path / "lb.json"
    path.write_text(json.dumps(data))
    monkeypatch.setenv("KVVIZ_LEADERBOARD", str(path))
    return data


def test_a_stored_result_is_read_by_key(stored):
    data = results.load_result()
    assert data["config"]["policies"] == ["snapkv", "knorm"]
    key = stored["samples"][0]["key"]
    assert results.sample(data, key)["answers"] == ["1234567"]
    with pytest.raises(ValueError, match="No sample"):
        results.sample(data, "nope")
    assert "2 samples" in tab_leaderboard.about(data) and "query-agnostic" in tab_leaderboard.about(data)
    note = tab_leaderboard.needle_note(results.sample(data, key))
    assert "tokens 240–259" in note and "1234567" in note


def test_no_result_says_how_to_make_one(tmp_path, monkeypatch):
    monkeypatch.setenv("KVVIZ_LEADERBOARD", str(tmp_path / "missing.json"))
    assert results.load_result() is None
    assert "bench/leaderboard.py" in tab_leaderboard.about(None)


def _array(values) -> np.ndarray:
    """A plotly JSON array: a plain list, or plotly's typed array (base64 bytes and their dtype)."""
    if isinstance(values, dict):
        return np.frombuffer(base64.b64decode(values["bdata"]), dtype=np.dtype(values["dtype"]))
    return np.asarray(values)


def test_the_tab_builds_after_the_eviction_tab_with_the_stored_curves(lm, stored):
    ctx = AppContext(lm=lm, settings=Settings(max_new_tokens=16))
    with gr.Blocks() as demo, gr.Tabs() as ctx.tabs:
        with gr.Tab("Eviction", id="tab_eviction"):
            tab_eviction.build(ctx)
        with gr.Tab("Leaderboard", id="tab_leaderboard"):
            tab_leaderboard.build(ctx)
    assert {"leaderboard.metric", "leaderboard.mode", "leaderboard.run"} <= set(ctx.components)
    by_id = {getattr(b, "elem_id", None): b for b in demo.blocks.values()}
    assert "2 samples" in by_id["lb-about"].value
    drawn = json.loads(by_id["lb-curves"].value["plot"])["data"]  # the stored curves, drawn at build time
    table, _ = fake_result()  # what the fixture stored
    aware = table[table["mode"] == "query_aware"].sort_values("ratio")
    assert {t["name"] for t in drawn} == {"snapkv", "knorm"}
    for trace in drawn:
        mine = aware[aware["policy"] == trace["name"]]
        assert list(_array(trace["x"])) == list(mine["ratio"])
        assert list(_array(trace["y"])) == list(mine["string_match"] * 100)
    assert len(by_id["lb-samples"].value["data"]) == 2  # SnapKV at 0.5, query-aware: both samples


def test_the_leaderboard_and_the_needle_demo_link_to_each_other(lm, stored):
    """Each view says why SnapKV differs between them and links the other; the links are deep links to real tabs."""
    from kvviz.figures import eviction as efig
    from kvviz.figures import leaderboard as lfig
    from kvviz.ui.app import TABS
    from kvviz.ui.page.deeplinks import parse_link

    ctx = AppContext(lm=lm, settings=Settings(max_new_tokens=16))
    with gr.Blocks() as demo, gr.Tabs() as ctx.tabs:
        with gr.Tab("Eviction", id="tab_eviction"):
            tab_eviction.build(ctx)
        with gr.Tab("Leaderboard", id="tab_leaderboard"):
            tab_leaderboard.build(ctx)
    by_id = {getattr(b, "elem_id", None): b for b in demo.blocks.values()}
    assert lfig.DEMO_LINK in by_id["lb-vs-needle"].value
    texts = [getattr(b, "value", None) for b in demo.blocks.values() if isinstance(b, gr.Markdown)]
    assert any(efig.LEADERBOARD_NOTE in (t or "") for t in texts)
    tab_ids = [tab_id for _, tab_id, _ in TABS]
    for link, tab in ((lfig.DEMO_LINK, "tab_eviction"), (efig.LEADERBOARD_LINK, "tab_leaderboard")):
        assert parse_link(dict([link.removeprefix("?").split("=")]), {}, tab_ids).tab == tab
