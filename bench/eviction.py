"""Decode tokens/s under each eviction policy vs the full cache, on the same long prompt.

Run: ``.venv/bin/python bench/eviction.py [--prompt-tokens 4096] [--new-tokens 64] [--budget 1024]
[--repeats 1] [--policies full,streaming_llm,window,h2o,snapkv]``.
Expectation: a policy whose cache is smaller must not decode slower than the full cache.
Every run decodes exactly ``--new-tokens`` tokens (no early stop) through kvviz's own loop
(:func:`kvviz.eviction.run.run_policy`); tokens/s = 1 / the median decode step (forward + eviction),
which a busy machine disturbs less than a total, and the median CPU-seconds per step of this
process (steadier still when other processes share the cores). The table also shows a bare
transformers loop over a DynamicCache for reference. Writes ``bench/results/eviction.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from _common import RESULTS, chapter_prompt_ids, never_stopping
from transformers import DynamicCache

from kvviz.capture.model_io import forward
from kvviz.eviction.policies import POLICIES, make_policy
from kvviz.eviction.run import run_policy
from kvviz.models import load_model

SLOWER = 0.95  # below this fraction of the full cache's tokens/s a policy counts as slower


def plain_decode(lm, ids: list[int], n_new: int) -> float:
    """Decode tokens/s (1 / median step) of a bare loop over transformers' DynamicCache (no kvviz machinery)."""
    cache = DynamicCache(config=lm.config)
    steps = []
    with torch.inference_mode():
        logits = forward(lm, ids, 0, cache, None)[-1]
        for i in range(n_new - 1):
            t0 = time.perf_counter()
            logits = forward(lm, [int(torch.argmax(logits))], len(ids) + i, cache, None)[-1]
            steps.append(time.perf_counter() - t0)
    return 1.0 / statistics.median(steps)


def one_run(lm, ids: list[int], name: str, budget: int, n_new: int) -> dict:
    run = run_policy(lm, ids, make_policy(name), budget=budget, max_new_tokens=n_new, record_history=False)
    return {
        "policy": name,
        "n_kept": run.n_kept,
        "step_s": run.timings["decode_step_median_s"],
        "step_cpu_s": run.timings["decode_step_median_cpu_s"],
        "prefill_s": run.timings["prefill_s"],
        "cache_bytes_end": run.cache_bytes,
        "full_cache_bytes_end": run.full_cache_bytes,
        "generated": len(run.generated_ids),
    }


def all_policies(lm, ids: list[int], names: list[str], budget: int, n_new: int, repeats: int) -> list[dict]:
    """Policies interleaved (the order rotates every repeat) so a busy machine hurts them alike;
    per policy the median over repeats of each run's median decode-step time."""
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            runs[name].append(one_run(lm, ids, name, budget, n_new))
    rows = []
    for name in names:
        step = statistics.median(x["step_s"] for x in runs[name])
        cpu = statistics.median(x["step_cpu_s"] for x in runs[name])
        rows.append(
            {
                **runs[name][-1],
                "step_s": step,
                "decode_tokens_per_s": 1.0 / step,
                "step_cpu_s": cpu,
                "prefill_s": statistics.median(x["prefill_s"] for x in runs[name]),
            }
        )
    return rows


def main(argv: list[str] | None = None, lm=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompt-tokens", type=int, default=4096)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--budget", type=int, default=1024, help="tokens kept per layer and KV head")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--out", type=Path, default=RESULTS / "eviction.json")
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.policies.split(",") if n.strip()]
    unknown = [n for n in names if n not in POLICIES]
    if unknown:
        ap.error(f"unknown policies: {', '.join(unknown)}")
    if "full" not in names:
        names.insert(0, "full")
    lm = never_stopping(lm or load_model())
    ids = chapter_prompt_ids(lm.tokenizer, args.prompt_tokens)
    rows = all_policies(lm, ids, names, args.budget, args.new_tokens, args.repeats)
    full = next(r for r in rows if r["policy"] == "full")
    for r in rows:
        r["vs_full"] = r["decode_tokens_per_s"] / full["decode_tokens_per_s"]
        r["cpu_vs_full"] = full["step_cpu_s"] / r["step_cpu_s"]  # > 1: fewer CPU-seconds per token than full
        r["smaller_cache"] = r["cache_bytes_end"] < r["full_cache_bytes_end"]
        r["slower_than_full"] = bool(r["smaller_cache"] and min(r["vs_full"], r["cpu_vs_full"]) < SLOWER)
    result = {
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
        "budget": args.budget,
        "repeats": args.repeats,
        "device": str(lm.device),
        "threads": torch.get_num_threads(),
        "plain_dynamic_cache_tokens_per_s": plain_decode(lm, ids, args.new_tokens),
        "policies": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(
        f"prompt {args.prompt_tokens} tokens, {args.new_tokens} new, budget {args.budget} "
        f"(plain DynamicCache loop: {result['plain_dynamic_cache_tokens_per_s']:.1f} tokens/s)"
    )
    for r in rows:
        flag = "SLOWER" if r["slower_than_full"] else "ok"
        print(
            f"  {r['policy']:<14} {r['decode_tokens_per_s']:7.1f} tokens/s  ×{r['vs_full']:.2f} vs full  "
            f"{1000 * r['step_cpu_s']:7.1f} CPU-ms/token  ×{r['cpu_vs_full']:.2f}  "
            f"cache {r['cache_bytes_end'] / 2**20:7.1f} MiB  prefill {r['prefill_s']:.1f} s  {flag}"
        )
    return result


if __name__ == "__main__":
    main()
