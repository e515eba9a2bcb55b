"""``python -m kvviz serve-sim``: the room served under a KV budget, in one way of spending it, on the real model.

    python -m kvviz serve-sim --budget-mib 16 --mode paged --json
    python -m kvviz serve-sim --budget-mib 720 --mode contiguous-context --students 4 --waves 1 --new-tokens 8

The lecture room's requests (the example everyone presses, then waves of each student's own question,
``--gap`` steps apart) are replayed step by step (:func:`kvviz.engine.budget.replay`): admission waits
for memory, every running sequence decodes in one batch, a paged mode preempts (and later recomputes) the
latest admitted when no block is free. Every answer is compared with the request's solo run. The same
numbers as the stored replays of the Blocks tab (``bench/kv_budget.py``).
"""

from __future__ import annotations

import argparse
import json

from kvviz.commands.common import add_placement_args
from kvviz.engine.budget_ledger import MODES


def add_parser(sub) -> None:
    p = sub.add_parser(
        "serve-sim",
        help="the room served under a KV budget: sequences admitted, tokens/s, preemptions",
        description="Replay the lecture room's requests under a KV budget in bytes, in one mode, decoding "
        "the running sequences together on the model; every answer is compared with its solo run.",
    )
    p.add_argument("--budget-mib", type=float, required=True, help="the KV budget in MiB")
    p.add_argument("--mode", choices=MODES, default="paged", help="how the budget is spent (default paged)")
    p.add_argument("--students", type=int, default=24, help="students per wave (default 24)")
    p.add_argument("--waves", type=int, default=3, help="waves of questions (default 3)")
    p.add_argument("--gap", type=int, default=8, help="steps between waves (default 8)")
    p.add_argument("--new-tokens", type=int, default=16, help="new tokens per request (default 16)")
    p.add_argument("--model", default=None, help="bundled (default), a local folder, or a Hugging Face id")
    p.add_argument("--device", default=None, help="cpu, cuda, mps (default: best available)")
    p.add_argument("--dtype", default=None, help="float32, bfloat16, float16 (default: fp32 on CPU, bf16 on GPU)")
    add_placement_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object (the replay, compact; bytes)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from kvviz.commands.common import load
    from kvviz.engine.budget import replay
    from kvviz.engine.budget_store import compact
    from kvviz.engine.budget_trace import compare_solo, room_trace, solo_runs
    from kvviz.limits import MAX_KV_BUDGET_BYTES, MAX_KV_BUDGET_REQUESTS, bounded_int

    bounded_int(args.students * args.waves + 1, "requests (students × waves + 1)", 1, MAX_KV_BUDGET_REQUESTS)
    if not 0 < args.budget_mib <= MAX_KV_BUDGET_BYTES / 2**20:
        raise ValueError(f"--budget-mib must be in (0, {MAX_KV_BUDGET_BYTES / 2**20:,.0f}]; got {args.budget_mib}.")
    lm = load(args)
    requests = room_trace(args.students, args.waves, args.gap, args.new_tokens)
    result = replay(lm, requests, int(args.budget_mib * 2**20), args.mode)
    out = compact(compare_solo(result, solo_runs(lm, requests)))
    if args.json:
        print(json.dumps({"model": lm.name, **out}))
        return 0
    s = out["summary"]
    print(f"{lm.name}, {args.mode} under {args.budget_mib:g} MiB of KV: {len(requests)} requests in {s['steps']} steps")
    print(f"  running at once: at most {s['max_running']}, {s['mean_running']:.1f} on average")
    rate = f"{s['tokens_per_s']:.1f}" if s["tokens_per_s"] else "–"
    print(f"  {s['new_tokens']} new tokens: {rate} tokens/s, {s['tokens_per_step']:.2f} per step")
    print(f"  time to first token: p50 {s['ttft_steps_p50']:.0f} steps, p95 {s['ttft_steps_p95']:.0f} steps")
    print(f"  preemptions: {s['preemptions']}; most bytes held: {s['peak_bytes']:,}")
    same = "every answer equals its solo run" if s["all_same_as_solo"] else f"agreement {s['agreement']:.0%}"
    print(f"  {same}")
    for e in out["events"][:5]:
        print(f"  step {e['step']}: {e['why']}")
    return 0
