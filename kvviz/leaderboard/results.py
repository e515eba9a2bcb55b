"""A stored sweep result (``bench/results/leaderboard.json``): loaded once, read as tables, samples found by key."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
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


Z95 = 1.959964  # the standard normal's 97.5 % quantile: two-sided 95 % intervals
INTERVAL_METRICS = ("string_match", "needle_retention", "top1_agreement", "mean_kl")
POINT = ["policy", "mode", "ratio"]


def wilson_interval(hits: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson's score interval for a share of ``hits`` out of ``n`` trials: unlike mean ± z·SE it stays inside
    [0, 1] and is not empty at 0 % or 100 %, which 25-sample scores of 0/1 often are."""
    if n <= 0:
        return math.nan, math.nan
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def interval(values: np.ndarray) -> tuple[float, float]:
    """95 % interval of a point's mean over its samples: Wilson's for 0/1 scores (string match), mean ± z·SE else."""
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    if len(v) == 0:
        return math.nan, math.nan
    if np.isin(v, (0.0, 1.0)).all():
        return wilson_interval(float(v.sum()), len(v))
    half = Z95 * float(v.std(ddof=1)) / math.sqrt(len(v)) if len(v) > 1 else math.nan
    return float(v.mean()) - half, float(v.mean()) + half


def intervals(records: pd.DataFrame) -> pd.DataFrame:
    """Per point (policy, mode, ratio): ``<metric>_lo`` and ``<metric>_hi``, the 95 % interval of each metric's mean."""
    rows = []
    for key, part in records.groupby(POINT, sort=False):
        row = dict(zip(POINT, key))
        for m in INTERVAL_METRICS:
            if m in part:
                row[f"{m}_lo"], row[f"{m}_hi"] = interval(part[m].to_numpy())
        rows.append(row)
    return pd.DataFrame(rows)


def table(data: dict) -> pd.DataFrame:
    """The points (one row per policy, mode and ratio), with each metric's 95 % interval from the stored records."""
    points = pd.DataFrame(data["table"])
    if not data.get("records"):
        return points
    return points.merge(intervals(records(data)), on=POINT, how="left")


def records(data: dict) -> pd.DataFrame:
    return pd.DataFrame(data["records"])


def sample(data: dict, key: str) -> dict:
    """The stored sample (context, question, needle span, answers) with this key."""
    for s in data["samples"]:
        if s["key"] == key:
            return s
    raise ValueError(f"No sample {key!r} in this result.")
