"""The ``python -m kvviz check`` contract: JSON with the first divergence, the token verdict and the map;
an unknown fault refused by argparse; the chapter's check printed as the chapter prints it."""

from __future__ import annotations

import json

import pytest

from kvviz.__main__ import main

pytestmark = pytest.mark.slow  # the real model, a run and a recomputation


def test_json_names_the_first_divergence(capsys):
    code = main(
        [
            "check",
            "--prompt",
            "Name a colour.",
            "--fault",
            "gqa_wrong_group",
            "--step",
            "2",
            "--layer",
            "4",
            "--max-new-tokens",
            "4",
            "--json",
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["diverged"] is True
    assert (out["first"]["step"], out["first"]["layer"], out["first"]["quantity"]) == (2, 4, "attention output")
    assert out["fault"]["name"] == "gqa_wrong_group" and out["fault"]["lesson"]
    assert len(out["map"]) == 4 and out["tolerance_rule"].startswith("|Δ| ≤ √eps")


def test_no_fault_text_is_all_clear(capsys):
    assert main(["check", "--prompt", "Name a colour.", "--max-new-tokens", "3"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("No divergence:") and "unchanged" in out


def test_unknown_fault_is_refused(capsys):
    with pytest.raises(SystemExit):
        main(["check", "--fault", "sinks_dropped"])
    assert "invalid choice: 'sinks_dropped'" in capsys.readouterr().err


def test_the_chapter_prints_its_two_lines(capsys):
    assert main(["check", "--chapter"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("cache shape: (2, 3, 12, 64) max diff: ")
    assert lines[1].startswith("with causal=True in decode: cache shape: (2, 3, 12, 64) max diff: ")
