"""The first-divergence finder's cost against one full recomputation.

The finder drives the cached run with read-only hooks (each step's new K/V, attention outputs, logits),
recomputes the fed sequence once from scratch and compares. Its cost is what it adds to the run:
(finder total − the same run without hooks); the target is at most one recomputation + 20 %.

Run: ``.venv/bin/python bench/debugger.py [--prompt-tokens 512] [--new-tokens 32] [--repeats 3]``.
Writes ``bench/results/debugger.json`` (seconds; wall-clock and process CPU, the median of the repeats).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from _common import RESULTS, chapter_prompt_ids, never_stopping

from kvviz.capture.divergence import find, recompute
from kvviz.capture.drive import drive
from kvviz.capture.generation import Generation
from kvviz.capture.options import Decode, Feed, Recording
from kvviz.models import load_model

TARGET = 1.2  # the finder's added time ≤ 1.2 × one recomputation


def timed(fn) -> tuple[float, float, object]:
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, out


def main(argv: list[str] | None = None, lm=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=RESULTS / "debugger.json")
    args = p.parse_args(argv)
    lm = never_stopping(lm or load_model())
    ids = chapter_prompt_ids(lm.tokenizer, args.prompt_tokens)

    def generation() -> Generation:
        return Generation(
            lm,
            "",
            feed=Feed(prompt_ids=ids),
            decode=Decode(max_new_tokens=args.new_tokens, stop_on_eos=False),
            recording=Recording(on=False),
        )

    rows = {"run": [], "recompute": [], "finder": []}
    for _ in range(args.repeats):  # interleaved, so a busy spell slows all three alike
        w, c, g = timed(lambda: drive(lm, generation()))
        rows["run"].append((w, c))
        fed = g.trace.token_ids[: g.trace.n_fed]
        w, c, _ = timed(lambda fed=fed: recompute(lm, fed, args.new_tokens))
        rows["recompute"].append((w, c))
        w, c, report = timed(lambda: find(lm, generation()))
        rows["finder"].append((w, c))
        if report.first is not None:
            raise RuntimeError(f"A fault-free run diverged: {report.first}")

    def median(name: str, i: int) -> float:
        return statistics.median(r[i] for r in rows[name])

    result = {
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
        "device": str(lm.device),
        "dtype": str(lm.dtype),
        "threads": torch.get_num_threads(),
        **{f"{n}_median_s": median(n, 0) for n in rows},
        **{f"{n}_median_cpu_s": median(n, 1) for n in rows},
    }
    added = result["finder_median_s"] - result["run_median_s"]
    result["finder_added_s"] = added
    result["added_vs_recompute"] = added / result["recompute_median_s"]
    result["target"] = TARGET
    result["met"] = result["added_vs_recompute"] <= TARGET
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
