"""Stored replays under KV budgets: a set of budgets × every mode on one trace, kept as one JSON file.

:func:`sweep` replays a trace (:func:`~kvviz.engine.budget.replay`) at each budget in each mode, compares
every answer with the request's solo run, and keeps each replay compact — per-step columns, per-request
numbers — so the Blocks tab draws any budget from the file at once. ``bench/kv_budget.py`` writes
``bench/results/kv_budget.json`` with two cases: the room (short chat questions in waves) and long
prompts (fewer fit, and each decode step reads more KV). :func:`load` reads it, :func:`table` gives one
row per mode and budget.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd

from kvviz.capture.model_io import model_info
from kvviz.engine.budget import replay
from kvviz.engine.budget_ledger import MODES, Ledger
from kvviz.engine.budget_trace import Request, compare_solo, solo_runs
from kvviz.models import LoadedModel

DEFAULT_RESULT = Path(__file__).resolve().parents[2] / "bench" / "results" / "kv_budget.json"
STEP_COLUMNS = ("step", "running", "waiting", "fed_tokens", "new_tokens", "tensor_bytes", "seconds")
BYTE_KINDS = ("empty", "held", "shared", "compressed")


def compact(result: dict) -> dict:
    """A replay as stored: its summary and events, its steps as columns (bytes by kind), its requests'
    numbers and answers."""
    steps = result["steps"]
    columns = {c: [s[c] for s in steps] for c in STEP_COLUMNS}
    columns.update({f"bytes_{k}": [s["bytes"][k] for s in steps] for k in BYTE_KINDS})
    columns["preempted"] = [len(s["preempted"]) for s in steps]
    keep = ("index", "prompt_tokens", "arrival", "admitted", "first_token_steps", "first_token_s", "finished")
    reqs = [
        {**{k: q[k] for k in keep}, "preemptions": q["preemptions"], "answer": q["answer"]}
        | {k: q[k] for k in ("same_as_solo", "agreement") if k in q}
        for q in result["requests"]
    ]
    return {
        "mode": result["mode"],
        "budget": result["budget"],
        "fits": True,
        "summary": result["summary"],
        "steps": columns,
        "events": result["events"],
        "requests": reqs,
    }


def sweep(
    lm: LoadedModel,
    requests: Sequence[Request],
    budgets: Sequence[int],
    modes: Sequence[str] = MODES,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Every mode at every budget on ``requests``: one compact replay each (a budget that holds no request
    in a mode is kept as ``fits: False`` with the reason), each answer compared with its solo run."""
    solo = solo_runs(lm, requests)
    out = []
    for budget in budgets:
        for mode in modes:
            try:
                result = compare_solo(replay(lm, requests, budget, mode), solo)
            except ValueError as exc:
                out.append({"mode": mode, "budget": budget, "fits": False, "reason": str(exc)})
                continue
            out.append(compact(result))
            if progress is not None:
                s = result["summary"]
                progress(f"{mode} at {budget / 2**20:.1f} MiB: {s['max_running']} running, {s['steps']} steps")
    ledger = Ledger(model_info(lm), "paged")
    return {
        "requests": [{"prompt": r.prompt, "arrival": r.arrival, "max_new_tokens": r.max_new_tokens} for r in requests],
        "per_token_bytes": ledger.per_token,
        "context": ledger.context,
        "block_tokens": ledger.block,
        "replays": out,
    }


def load(path: Path | str | None = None) -> dict:
    """The stored replays (``bench/results/kv_budget.json`` unless ``path``)."""
    return json.loads(Path(path or DEFAULT_RESULT).read_text(encoding="utf-8"))


def budgets(result: dict, case: str) -> list[int]:
    return sorted({r["budget"] for r in result["cases"][case]["replays"]})


def replays_at(result: dict, case: str, budget: int) -> list[dict]:
    """Every mode's replay at the stored budget nearest ``budget``, in :data:`MODES` order."""
    stored = budgets(result, case)
    nearest = min(stored, key=lambda b: abs(b - budget))
    rows = [r for r in result["cases"][case]["replays"] if r["budget"] == nearest]
    return sorted(rows, key=lambda r: MODES.index(r["mode"]))


def table(result: dict, case: str) -> pd.DataFrame:
    """One row per mode and budget: sequences admitted at once (most, mean), tokens per second and per step,
    time to first token, preemptions, whether every answer was its solo run (agreement for the lossy mode)."""
    rows = []
    for r in result["cases"][case]["replays"]:
        s = r.get("summary", {})
        rows.append(
            {
                "mode": r["mode"],
                "budget (MiB)": r["budget"] / 2**20,
                "fits": r["fits"],
                "most running": s.get("max_running", 0),
                "mean running": s.get("mean_running", 0.0),
                "tokens/s": s.get("tokens_per_s"),
                "tokens/step": s.get("tokens_per_step"),
                "TTFT p50 (steps)": s.get("ttft_steps_p50"),
                "TTFT p95 (steps)": s.get("ttft_steps_p95"),
                "TTFT p50 (s)": s.get("ttft_s_p50"),
                "TTFT p95 (s)": s.get("ttft_s_p95"),
                "preemptions": s.get("preemptions", 0),
                "same as solo": s.get("all_same_as_solo"),
                "agreement": s.get("agreement"),
            }
        )
    return pd.DataFrame(rows)
