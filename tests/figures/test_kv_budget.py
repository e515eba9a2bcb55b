"""The KV-budget view's figures, drawn from a sweep of a tiny model (the stored file's own format)."""

from __future__ import annotations

import pytest

from kvviz.capture.model_io import model_info
from kvviz.engine.budget_ledger import MODES, Ledger
from kvviz.engine.budget_store import budgets, replays_at, sweep, table
from kvviz.engine.budget_trace import Request
from kvviz.figures import kv_budget as fig
from tests.tiny_models import tiny_model


@pytest.fixture(scope="module")
def stored():
    lm = tiny_model("llama")
    reqs = [Request(f"r{i}", i, 4, False, tuple(range(10 + 8 * i, 22 + 8 * i))) for i in range(4)]
    per_token = Ledger(model_info(lm), "paged").per_token
    context = model_info(lm).context_length * per_token
    case = sweep(lm, reqs, [40 * per_token, 2 * context + 8 * per_token])
    return {"cases": {"room": case}}, context


def test_a_budget_below_one_reservation_says_so_and_the_others_draw(stored):
    result, _ = stored
    small = replays_at(result, "room", budgets(result, "room")[0])
    assert [r["mode"] for r in small] == list(MODES)
    assert not small[0]["fits"] and "holds no request" in small[0]["reason"]
    running = fig.running_figure(small)
    assert [t.name for t in running.data] == [fig.MODE_TITLES[m] for m in MODES[1:]]
    frame = fig.modes_table(small)
    assert frame.loc[0, "most running"] == 0 and "holds no request" in frame.loc[0, "note"]
    bars = fig.bytes_figure(small)
    assert [t.name for t in bars.data] == ["empty", "held", "shared", "compressed"]


def test_the_note_compares_paged_with_contiguous_to_context(stored):
    result, context = stored
    big = budgets(result, "room")[-1]
    rows = {r["mode"]: r for r in replays_at(result, "room", big)}
    ratio = rows["paged"]["summary"]["max_running"] / rows["contiguous-context"]["summary"]["max_running"]
    assert rows["contiguous-context"]["summary"]["max_running"] == 2  # two reservations of the whole context
    text = fig.note(result, "room", big)
    assert f"Paged runs {ratio:.1f}× as many sequences" in text
    tput = fig.throughput_figure(result, "room", big)
    assert len(tput.data) == len(MODES)
    assert set(table(result, "room")["mode"]) == set(MODES)


def test_one_budget_draws_a_bar_per_mode_not_a_curve_of_one_point(stored):
    result, _ = stored
    big = budgets(result, "room")[-1]
    one = {"cases": {"live": {**result["cases"]["room"], "replays": replays_at(result, "room", big)}}}
    tput = fig.throughput_figure(one, "live", big)
    (bars,) = tput.data
    assert bars.type == "bar" and list(bars.x) == [fig.MODE_TITLES[m] for m in MODES]
    rates = {r["mode"]: r["summary"]["tokens_per_s"] for r in replays_at(result, "room", big)}
    assert list(bars.y) == pytest.approx([rates[m] for m in MODES])


def _replay(mode: str, running, fed, kv, seconds) -> dict:
    return {
        "mode": mode,
        "fits": True,
        "steps": {"running": running, "fed_tokens": fed, "tensor_bytes": kv, "seconds": seconds},
    }


def test_decode_time_keeps_decode_only_lossless_steps_and_its_title_compares_the_cases():
    room = [_replay("paged", [1, 1, 2], [40, 1, 2], [2**20, 2**20, 2**21], [3.0, 0.070, 0.130])]
    long = [
        _replay("paged", [1, 1, 1], [900, 1, 1], [40 * 2**20, 41 * 2**20, 42 * 2**20], [2.0, 0.090, 0.094]),
        _replay("paged+kivi2", [1, 1], [1, 1], [5 * 2**20, 5 * 2**20], [0.5, 0.5]),  # lossy: left out
    ]
    result = {"cases": {"room": {"replays": room}, "long": {"replays": long}}}
    steps = fig.decode_steps(result)
    # the prefill steps (a prompt fed) and the lossy mode are not decode-time points
    assert sorted(steps["seconds"]) == [0.070, 0.090, 0.094, 0.130]
    figure = fig.decode_time_figure(result)
    assert [t.name for t in figure.data] == [fig.CASE_TITLES["room"], fig.CASE_TITLES["long"]]
    # only the batch both share is drawn: a bigger batch reads more KV and computes more at once
    assert sorted(y for t in figure.data for y in t.y) == pytest.approx([70.0, 90.0, 94.0])
    title = figure.layout.title.text
    # both cases decoded one sequence at a time: their medians at that batch, as measured
    assert "one sequence decoding" in title and "70.0 ms at 1.0 MiB" in title and "92.0 ms at 41.5 MiB" in title


def test_the_stored_replays_draw_the_decode_time_of_both_cases():
    from kvviz.engine.budget_store import load

    figure = fig.decode_time_figure(load())
    assert {t.name for t in figure.data} == {fig.CASE_TITLES["room"], fig.CASE_TITLES["long"]}
    assert "Median decode step" in figure.layout.title.text
