"""``python -m kvviz sweep``: every policy at every compression ratio on generated retrieval tasks (the leaderboard).

Example::

    python -m kvviz sweep --policies snapkv,knorm --ratios 0,0.5,0.75 --tasks passkey --lengths 512 --samples 3 --json

Progress goes to stderr; Ctrl-C stops after the current sample and prints what was done. ``--out``
writes the full result (every record and the samples) for the app's Leaderboard tab.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from kvviz.eviction.policies import POLICIES
from kvviz.leaderboard.cells import MODES
from kvviz.leaderboard.sweep import DEFAULT_POLICIES, RATIOS
from kvviz.leaderboard.tasks import LENGTHS, TASKS

MAX_SAMPLES = 200  # per (task, length)


def _names(text: str, allowed, what: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in allowed]
    if bad or not names:
        raise ValueError(f"Unknown {what} {bad[0] if bad else '(none given)'!r}; choose from {', '.join(allowed)}.")
    return names


def _numbers(text: str, kind, what: str) -> list:
    try:
        return [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{what} must be a comma-separated list of numbers, got {text!r}.") from None


def add_parser(sub) -> None:
    p = sub.add_parser(
        "sweep",
        help="score every policy over compression ratios on generated retrieval tasks",
        description="RULER-style needle / multi-key / passkey retrieval at several lengths and needle "
        "depths; one prefill per sample reused by every (policy, ratio, mode) cell.",
    )
    p.add_argument("--policies", default=",".join(DEFAULT_POLICIES), help="comma-separated policy names")
    p.add_argument("--ratios", default=",".join(str(r) for r in RATIOS), help="compression ratios, e.g. 0,0.5,0.875")
    p.add_argument("--tasks", default=",".join(TASKS), help=f"comma-separated: {', '.join(TASKS)}")
    p.add_argument("--lengths", default="1024", help=f"prompt lengths in tokens, e.g. {','.join(map(str, LENGTHS))}")
    p.add_argument("--modes", default=",".join(MODES), help="query_aware (question compressed too), query_agnostic")
    p.add_argument("--samples", type=int, default=5, help="samples per task and length (needle depths 0–100 %%)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=10)
    p.add_argument("--model", default=None, help="bundled (default), a local folder, or a Hugging Face id")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--out", type=Path, default=None, help="write the full result (records + samples) as JSON")
    p.add_argument("--json", action="store_true", help="print the table as one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from kvviz.leaderboard.sweep import run_sweep
    from kvviz.leaderboard.tasks import make_samples
    from kvviz.models import load_model

    policies = _names(args.policies, list(POLICIES), "policy")
    tasks = _names(args.tasks, TASKS, "task")
    modes = tuple(_names(args.modes, MODES, "mode"))
    ratios = _numbers(args.ratios, float, "--ratios")
    lengths = _numbers(args.lengths, int, "--lengths")
    if not 1 <= args.samples <= MAX_SAMPLES:
        raise ValueError(f"--samples must be between 1 and {MAX_SAMPLES}.")
    if not 1 <= args.max_new_tokens <= 64:
        raise ValueError("--max-new-tokens must be between 1 and 64.")
    if any(not 64 <= n <= 8192 for n in lengths):
        raise ValueError("--lengths must be between 64 and 8192 tokens.")
    lm = load_model(args.model, device=args.device, dtype=args.dtype)
    samples = make_samples(lm, tasks, lengths, args.samples, args.seed)
    stop = {"now": False}

    def progress(fraction: float, what: str) -> None:
        print(f"[{100 * fraction:5.1f} %] {what}", file=sys.stderr, flush=True)

    def on_interrupt(signum, frame) -> None:
        if stop["now"]:  # a second Ctrl-C stops at once
            raise KeyboardInterrupt
        stop["now"] = True
        print("stopping after this sample (Ctrl-C again to stop now)", file=sys.stderr, flush=True)

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        result = run_sweep(
            lm,
            samples,
            policies,
            ratios,
            modes,
            args.max_new_tokens,
            progress=progress,
            should_stop=lambda: stop["now"],
        )
    finally:
        signal.signal(signal.SIGINT, previous)
    data = result.to_json()
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(data))
    table = result.table()
    if args.json:
        print(json.dumps({"config": data["config"], "timings": data["timings"], "table": data["table"]}))
        return 0
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(
        f"{len(result.samples)} samples in {result.timings['total_s']:.0f} s "
        f"(prefill {result.timings['prefill_s']:.0f} s, decode {result.timings['decode_s']:.0f} s)"
    )
    return 0
