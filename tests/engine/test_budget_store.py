"""The stored replays (bench/results/kv_budget.json, written by bench/kv_budget.py) say what the chapter says:
paged admits at least twice the sequences of contiguous-to-context at one budget, no step held more than its
budget, every request finished, and every lossless answer was its solo run."""

from __future__ import annotations

import time

from kvviz.engine.budget_ledger import LOSSY, MODES
from kvviz.engine.budget_store import DEFAULT_RESULT, budgets, load, replays_at, table


def test_paged_admits_at_least_twice_contiguous_to_context_at_a_stored_budget():
    result = load()
    ratios = {}
    for budget in budgets(result, "room"):
        rows = {r["mode"]: r for r in replays_at(result, "room", budget)}
        ctx, paged = rows["contiguous-context"], rows["paged"]
        if ctx["fits"] and paged["fits"]:
            ratios[budget] = paged["summary"]["max_running"] / ctx["summary"]["max_running"]
    assert ratios and max(ratios.values()) >= 2, ratios


def test_every_stored_replay_kept_its_budget_finished_and_answered_as_alone():
    result = load()
    for case in result["cases"].values():
        n = len(case["requests"])
        for r in case["replays"]:
            assert r["mode"] in MODES
            if not r["fits"]:
                assert "holds no request" in r["reason"]
                continue
            steps, budget = r["steps"], r["budget"]
            held = [
                sum(steps[f"bytes_{k}"][i] for k in ("empty", "held", "shared", "compressed"))
                for i in range(len(steps["step"]))
            ]
            assert max(held) <= budget and max(steps["tensor_bytes"]) <= budget
            assert len(r["requests"]) == n and all(q["finished"] is not None for q in r["requests"])
            if r["mode"] not in LOSSY:
                assert all(q["same_as_solo"] for q in r["requests"]), (r["mode"], budget)


def test_the_stored_file_loads_and_tabulates_within_a_second():
    t0 = time.perf_counter()
    result = load(DEFAULT_RESULT)
    frame = table(result, "room")
    assert time.perf_counter() - t0 < 1.0
    assert set(frame["mode"]) == set(MODES)
