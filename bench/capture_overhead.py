"""Time of a full capture vs plain ``model.generate`` (SDPA, no capture) on the same prompt and tokens.

Run: ``.venv/bin/python bench/capture_overhead.py [--cases 1024:128,4096:256] [--repeats 3]``.
Target (issue 4): capture ≤ 1.3× plain generation. Both run greedily to exactly the requested
number of tokens (no early stop) in one process, interleaved, and must produce the same tokens.
Writes ``bench/results/capture_overhead.json`` (seconds).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path

import torch
from _common import RESULTS, chapter_prompt_ids, never_stopping

from kvviz.capture import capture
from kvviz.models import load_model

TARGET_RATIO = 1.3


def plain_generate(lm, ids: list[int], n_new: int) -> tuple[float, list[int]]:
    """transformers' own greedy generate with SDPA, no stop token: seconds and new token ids."""
    cfg = copy.deepcopy(lm.model.generation_config)
    cfg.eos_token_id = None
    cfg.do_sample, cfg.max_new_tokens, cfg.min_new_tokens = False, n_new, None
    cfg.temperature = cfg.top_p = cfg.top_k = None
    cfg.pad_token_id = lm.tokenizer.pad_token_id or 0
    x = torch.tensor([ids], device=lm.device)
    assert lm.model.config._attn_implementation == "sdpa", "the baseline must be plain SDPA"
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = lm.model.generate(x, attention_mask=torch.ones_like(x), generation_config=cfg)
    return time.perf_counter() - t0, [int(i) for i in out[0, len(ids):]]


def captured(lm, ids: list[int], n_new: int) -> tuple[float, list[int], dict]:
    """kvviz's capture (own loop + recorder), greedy, no stop token: seconds, new ids, its timings."""
    t0 = time.perf_counter()
    trace = capture(never_stopping(lm), "", chat=False, prompt_ids=ids, max_new_tokens=n_new)
    return time.perf_counter() - t0, trace.token_ids[len(ids):], trace.timings


def run_case(lm, n_prompt: int, n_new: int, repeats: int) -> dict:
    """Interleave plain and captured runs (alternating which goes first) and compare medians."""
    ids = chapter_prompt_ids(lm.tokenizer, n_prompt)
    plain_s, capture_s, prefill_s = [], [], []
    for r in range(repeats):
        order = ("plain", "capture") if r % 2 == 0 else ("capture", "plain")
        for which in order:
            if which == "plain":
                seconds, plain_ids = plain_generate(lm, ids, n_new)
                plain_s.append(seconds)
            else:
                seconds, cap_ids, timings = captured(lm, ids, n_new)
                capture_s.append(seconds)
                prefill_s.append(timings["prefill_s"])
        if plain_ids != cap_ids:
            raise AssertionError(f"capture and plain generate disagree at {n_prompt}+{n_new} tokens")
    ratios = [c / p for c, p in zip(capture_s, plain_s)]
    return {
        "prompt_tokens": n_prompt, "new_tokens": n_new, "repeats": repeats, "same_tokens": True,
        "plain_s": plain_s, "capture_s": capture_s, "capture_prefill_s": prefill_s,
        "plain_median_s": statistics.median(plain_s), "capture_median_s": statistics.median(capture_s),
        "ratio_of_medians": statistics.median(capture_s) / statistics.median(plain_s),
        "median_pair_ratio": statistics.median(ratios), "target_ratio": TARGET_RATIO,
    }


def table(rows: list[dict]) -> str:
    out = [f"{'case':>12} {'plain (s)':>10} {'capture (s)':>12} {'ratio':>7} {'pair ratio':>11}  target ≤ {TARGET_RATIO}×"]
    for r in rows:
        verdict = "met" if r["ratio_of_medians"] <= TARGET_RATIO else "MISSED"
        out.append(f"{r['prompt_tokens']:>6}+{r['new_tokens']:<5} {r['plain_median_s']:>10.2f} {r['capture_median_s']:>12.2f} "
                   f"{r['ratio_of_medians']:>6.2f}× {r['median_pair_ratio']:>10.2f}×  {verdict}")
    return "\n".join(out)


def parse_cases(text: str) -> list[tuple[int, int]]:
    try:
        cases = [tuple(int(x) for x in part.split(":")) for part in text.split(",") if part.strip()]
    except ValueError:
        raise SystemExit("--cases must look like 1024:128,4096:256") from None
    if not cases or any(len(c) != 2 or min(c) < 1 for c in cases):
        raise SystemExit("--cases must look like 1024:128,4096:256")
    return cases


def main(argv: list[str] | None = None, lm=None) -> dict:
    """Parse the arguments, run the cases, print the table and save (``lm``: a loaded model to reuse)."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--cases", default="1024:128,4096:256", help="prompt:new pairs, comma-separated")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    p.add_argument("--out", default=str(RESULTS / "capture_overhead.json"), help="JSON file to write ('' = none)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    lm = lm or load_model()
    plain_generate(lm, chapter_prompt_ids(lm.tokenizer, 32), 2)  # warm-up: first calls pay one-off costs
    captured(lm, chapter_prompt_ids(lm.tokenizer, 32), 2)
    rows = []
    for n_prompt, n_new in parse_cases(args.cases):
        rows.append(run_case(lm, n_prompt, n_new, args.repeats))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    print(table(rows))
    result = {"model": lm.name, "device": str(lm.device), "threads": torch.get_num_threads(), "cases": rows}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
