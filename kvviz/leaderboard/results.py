"""A stored sweep result (``bench/results/leaderboard.json``): loaded once, read as tables, samples found by key."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from kvviz.settings import env

DEFAULT_RESULT = Path(__file__).resolve().parents[2] / "bench" / "results" / "leaderboard.json"


def result_path() -> Path:
    """The result the app shows: ``KVVIZ_LEADERBOARD`` if set, else the repository's bench result."""
    return Path(env("KVVIZ_LEADERBOARD", str(DEFAULT_RESULT)))


def load_result(path: Path | None = None) -> dict | None:
    """The sweep result as written by ``SweepResult.to_json()``, or None when there is none."""
    path = path or result_path()
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    if not {"table", "records", "samples", "config"} <= set(data):
        raise ValueError(f"{path} is not a kvviz sweep result (it lacks table, records, samples or config).")
    return data


def table(data: dict) -> pd.DataFrame:
    return pd.DataFrame(data["table"])


def records(data: dict) -> pd.DataFrame:
    return pd.DataFrame(data["records"])


def sample(data: dict, key: str) -> dict:
    """The stored sample (context, question, needle span, answers) with this key."""
    for s in data["samples"]:
        if s["key"] == key:
            return s
    raise ValueError(f"No sample {key!r} in this result.")
