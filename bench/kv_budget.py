"""KV memory caps the batch: the room (and long prompts) served under KV budgets, four ways to spend them.

Run: ``.venv/bin/python bench/kv_budget.py`` (defaults: the room's 73 requests — the example everyone
presses and three waves of 24 students, 8 steps apart, 16 new tokens each — at 8, 16, 32, 64 and 720 MiB;
eight 2,000-token chapter windows at 90, 180 and 720 MiB). Every mode at every budget
(:func:`kvviz.engine.budget_store.sweep`: contiguous to the model's context, contiguous to prompt + new
tokens, paged, paged with prefix sharing, paged with KIVI-2), each answer compared with its solo run.
Writes ``bench/results/kv_budget.json`` (``--out``), the Blocks tab's "Serving under a KV budget", with
the wall time it took and the load average the machine had. Steps, admissions, preemptions and answers
are deterministic; the seconds are the machine's, so run it on a quiet one.
``--smoke`` runs a tiny case (three students, one wave, four tokens, two budgets) to check the script.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
from _common import RESULTS

from kvviz.demo_files import machine
from kvviz.engine.budget_store import sweep
from kvviz.engine.budget_trace import long_trace, room_trace
from kvviz.models import load_model

MIB = 2**20


def main(argv: list[str] | None = None, lm=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--students", type=int, default=24)
    ap.add_argument("--waves", type=int, default=3)
    ap.add_argument("--gap", type=int, default=8, help="steps between waves")
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--budgets-mib", type=float, nargs="+", default=[8, 16, 32, 64, 720])
    ap.add_argument("--long", type=int, default=8, help="long-prompt requests (0: no long case)")
    ap.add_argument("--long-tokens", type=int, default=2000)
    ap.add_argument("--long-budgets-mib", type=float, nargs="+", default=[90, 180, 720])
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--smoke", action="store_true", help="a tiny case to check the script")
    ap.add_argument("--out", type=Path, default=RESULTS / "kv_budget.json")
    args = ap.parse_args(argv)
    if args.smoke:
        args.students, args.waves, args.new_tokens, args.budgets_mib = 3, 1, 4, [3, 720]
        args.long, args.long_tokens, args.long_budgets_mib = 2, 200, [20]
    if args.threads:
        torch.set_num_threads(args.threads)
    lm = lm or load_model()
    t0 = time.perf_counter()
    cases = {}
    room = room_trace(args.students, args.waves, args.gap, args.new_tokens)
    cases["room"] = sweep(lm, room, [int(b * MIB) for b in args.budgets_mib], progress=print)
    if args.long:
        long = long_trace(lm, args.long, args.long_tokens, args.new_tokens)
        cases["long"] = sweep(lm, long, [int(b * MIB) for b in args.long_budgets_mib], progress=print)
    wall = time.perf_counter() - t0
    report = {
        "model": lm.name,
        "dtype": str(lm.dtype),
        "machine": machine(),
        "threads": torch.get_num_threads(),
        "load_average": os.getloadavg(),
        "wall_s": wall,
        "smoke": args.smoke,
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "cases": cases,
    }
    args.out.write_text(json.dumps(report) + "\n", encoding="utf-8")
    print(f"wrote {args.out} in {wall:.0f} s")
    return report


if __name__ == "__main__":
    main()
    sys.exit(0)
