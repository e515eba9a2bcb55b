"""``python -m kvviz serve-sim``: the room under a KV budget, its JSON and its text, and refused budgets."""

from __future__ import annotations

import json

import pytest

from kvviz.__main__ import main


def serve_sim(mode: str, students: int, new_tokens: int, *extra: str) -> int:
    """``python -m kvviz serve-sim`` at 4 MiB on a small room of one wave."""
    args = ["--budget-mib", "4", "--mode", mode, "--students", str(students), "--waves", "1"]
    return main(["serve-sim", *args, "--new-tokens", str(new_tokens), *extra])


@pytest.mark.slow
def test_json_replay_of_a_small_room(capsys):
    assert serve_sim("paged", 2, 3, "--json") == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mode"] == "paged" and out["budget"] == 4 * 2**20 and out["fits"]
    assert len(out["requests"]) == 3 and out["summary"]["all_same_as_solo"]
    assert max(out["steps"]["tensor_bytes"]) <= 4 * 2**20
    assert serve_sim("paged+kivi2", 1, 2) == 0
    text = capsys.readouterr().out
    assert "paged+kivi2 under 4 MiB of KV: 2 requests" in text and "running at once: at most" in text


def test_a_budget_out_of_range_is_refused_before_loading(capsys):
    assert main(["serve-sim", "--budget-mib", "0", "--students", "1", "--waves", "1"]) == 2
    assert "--budget-mib must be in" in capsys.readouterr().err
    assert main(["serve-sim", "--budget-mib", "4", "--students", "200", "--waves", "3"]) == 2
    assert "requests (students × waves + 1)" in capsys.readouterr().err
