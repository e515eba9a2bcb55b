"""``python -m kvviz sweep``: the table as JSON, the full result file, and readable refusals."""

from __future__ import annotations

import json

import pytest

from kvviz.__main__ import main


@pytest.fixture
def same_model(lm, monkeypatch):
    monkeypatch.setattr("kvviz.models.load_model", lambda *a, **k: lm)  # the session's model, not a second load


def test_json_table_and_result_file(same_model, capsys, tmp_path):
    out = tmp_path / "lb.json"
    code = main(
        [
            "sweep",
            "--policies",
            "knorm,streaming_llm",
            "--ratios",
            "0,0.5",
            "--tasks",
            "passkey",
            "--lengths",
            "128",
            "--samples",
            "1",
            "--max-new-tokens",
            "3",
            "--out",
            str(out),
            "--json",
        ]
    )
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    rows = {(r["policy"], r["mode"], r["ratio"]) for r in data["table"]}
    assert rows == {
        (p, m, r) for p in ("knorm", "streaming_llm") for m in ("query_aware", "query_agnostic") for r in (0.0, 0.5)
    }
    assert data["timings"]["samples"] == 1
    saved = json.loads(out.read_text())
    assert len(saved["records"]) == 8 and saved["samples"][0]["task"] == "passkey" and saved["samples"][0]["context"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policies", "lru"], "Unknown policy"),
        (["--policies", "h2o"], "compresses once"),
        (["--tasks", "qa"], "Unknown task"),
        (["--ratios", "0,1.0"], "ratios"),
        (["--ratios", "half"], "numbers"),
        (["--samples", "0"], "--samples"),
        (["--lengths", "10"], "--lengths"),
    ],
)
def test_bad_requests_are_one_line_errors(same_model, capsys, args, message):
    base = ["sweep", "--tasks", "passkey", "--lengths", "128", "--samples", "1", "--ratios", "0,0.5"]
    assert main(base + args) == 2
    assert message in capsys.readouterr().err
