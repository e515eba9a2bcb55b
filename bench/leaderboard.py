"""The leaderboard sweep at full size, timed: writes bench/results/leaderboard.json (the app's Leaderboard tab loads it).

Run: ``.venv/bin/python bench/leaderboard.py [--samples 25] [--length 1024] [--threads 1] [--workers 2]``.
Default: 8 policies (StreamingLLM, SnapKV, KNorm, TOVA, ExpectedAttention, PyramidKV, AdaKV, KVzip) × ratios
{0, 0.25, 0.5, 0.75, 0.875} × {query-aware, query-agnostic} over 25 samples of 1,024 tokens (the
three tasks in turn, needle depths 0–100 %), one prefill per sample. Target: ≤ 600 s on the 2-core
CPU machine; the result records the wall time, its split (prefill, decisions, decoding) and the
load average the machine had, since other processes share the cores. KVzip's repeat passes (one per sample and
mode, on top of the shared prefill) are timed per record (``extra_prefill_s`` beside ``prefill_s``).

``--workers`` processes (default: one per core, at most two) each load the model and sweep every
``workers``-th sample with ``--threads`` torch threads: samples are independent, so the records are the
ones a single process writes, and two one-thread processes keep two cores busy where one two-thread
process spends much of its time in small ops that do not split. When the output file already holds a
sweep of the same configuration, the result reports how many cells differ from it (timings aside).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch
from _common import RESULTS

from kvviz.leaderboard.cells import MODES
from kvviz.leaderboard.sweep import DEFAULT_POLICIES, RATIOS, SweepResult, merged, run_sweep
from kvviz.leaderboard.tasks import TASKS, depths, make_sample
from kvviz.models import load_model

TARGET_S = 600.0
TIMING_FIELDS = ("prefill_s", "extra_prefill_s")  # wall-clock seconds: the only fields two runs may differ in


def samples_for(lm, n: int, length: int, seed: int = 0) -> list:
    """``n`` samples cycling through the tasks, needle depths spread over 0–100 %."""
    return [make_sample(lm, TASKS[i % len(TASKS)], length, d, seed + i) for i, d in enumerate(depths(n))]


def main(argv: list[str] | None = None, lm=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=25)
    ap.add_argument("--length", type=int, default=1024)
    ap.add_argument("--policies", default=",".join(DEFAULT_POLICIES))
    ap.add_argument("--ratios", default=",".join(map(str, RATIOS)))
    ap.add_argument("--max-new-tokens", type=int, default=10)
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1: on cores shared with other jobs, two threads ran 5× slower)",
    )
    ap.add_argument(
        "--workers",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="processes sweeping every workers-th sample each (1: this process, with the model given to main)",
    )
    ap.add_argument("--out", type=Path, default=RESULTS / "leaderboard.json")
    args = ap.parse_args(argv)
    if args.workers < 1:
        ap.error("--workers must be at least 1")
    previous = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        return _run(args, lm)
    finally:
        torch.set_num_threads(previous)


def _sweep_share(args: argparse.Namespace, share: int, lm=None) -> SweepResult:
    """Share ``share`` of ``args.workers``: every workers-th sample from the ``share``-th, swept in this process."""
    torch.set_num_threads(args.threads)
    lm = lm or load_model()
    samples = samples_for(lm, args.samples, args.length)[share :: args.workers]
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    ratios = [float(r) for r in args.ratios.split(",")]
    t0 = time.perf_counter()

    def progress(fraction: float, what: str) -> None:
        print(f"[worker {share}: {time.perf_counter() - t0:6.0f} s {100 * fraction:5.1f} %] {what}", flush=True)

    return run_sweep(lm, samples, policies, ratios, MODES, args.max_new_tokens, progress=progress)


SCORE_TOLERANCE = 1e-3  # float scores (KL, retention) that moved less than this count as unchanged: kernel noise


def _cells_changed(previous: dict, records: list[dict]) -> dict | None:
    """Records that differ from the stored sweep's (timings aside), by what moved: the generated answer, or a
    score by more than :data:`SCORE_TOLERANCE`; None when that sweep is another set-up.

    Matched by (sample, policy, mode, ratio), so a sweep merged from workers compares with one written in order.
    """
    if previous.get("config", {}).get("policies") is None or len(previous.get("records", [])) != len(records):
        return None
    key = lambda r: (r["sample"], r["policy"], r["mode"], r["ratio"])  # noqa: E731
    before = {key(r): r for r in previous["records"]}
    answers = scores = 0
    for record in records:
        old = before.get(key(record))
        if old is None:
            return None
        answers += old.get("answer") != record.get("answer")
        scores += any(
            abs(v - old[k]) > SCORE_TOLERANCE
            if isinstance(v, float) and isinstance(old.get(k), float)
            else v != old.get(k)
            for k, v in record.items()
            if k not in TIMING_FIELDS and k != "answer"
        )
    return {"answers": answers, "scores": scores, "score_tolerance": SCORE_TOLERANCE}


def _run(args: argparse.Namespace, lm) -> dict:
    stored = json.loads(args.out.read_text()) if args.out.exists() else {}
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    if args.workers == 1:
        result = _sweep_share(args, 0, lm)
    else:
        with ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            parts = list(pool.map(_sweep_share, [args] * args.workers, range(args.workers)))
        order = [s.key for s in samples_for(lm or load_model(), args.samples, args.length)]
        result = merged(parts, order)
    data = result.to_json()
    data["bench"] = {
        "wall_s": time.perf_counter() - t0,
        "target_s": TARGET_S,
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "workers": args.workers,
        "cells_changed_from_stored": _cells_changed(stored, data["records"]),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg()[0],
        "cells": len([p for p in args.policies.split(",") if p.strip()]) * len(args.ratios.split(",")) * len(MODES),
        "samples": len(result.samples),
        "length": args.length,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data))
    b, t = data["bench"], result.timings
    print(result.table().to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(
        f"{b['workers']} process(es) × {b['threads']} thread(s); records differing from the stored sweep "
        f"(answers, scores): {b['cells_changed_from_stored']}"
    )
    print(
        f"{b['samples']} samples × {b['cells']} cells in {b['wall_s']:.0f} s (target ≤ {TARGET_S:.0f} s; prefill "
        f"{t['prefill_s']:.0f} s, decisions {t['decide_s']:.0f} s, decoding {t['decode_s']:.0f} s; load average "
        f"{b['load_average_before']:.1f} → {b['load_average_after']:.1f} on {b['cpu_count']} cores)"
    )
    return data


if __name__ == "__main__":
    main()
