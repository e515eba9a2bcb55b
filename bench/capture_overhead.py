"""Time of a full capture vs plain SDPA generation without capture, on the same prompt and tokens.

Two baselines: transformers' own ``model.generate`` (SDPA), and kvviz's own prefill/decode loop with
nothing installed (SDPA, no recorder) — the second isolates what the recording itself costs.

Run: ``.venv/bin/python bench/capture_overhead.py [--cases 1024:128,4096:256] [--repeats 3]``.
Target: capture ≤ 1.1× plain generation (transformers' generate). Both run greedily to exactly the requested
number of tokens (no early stop) in one process, interleaved, and must produce the same tokens.
Wall-clock and process CPU time are both recorded (CPU time is steadier when other work shares
the machine). Writes ``bench/results/capture_overhead.json`` (seconds).
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
from transformers import DynamicCache

from kvviz.capture.loop import capture
from kvviz.capture.model_io import forward
from kvviz.models import load_model

TARGET_RATIO = 1.1


class Clock:
    """Wall-clock and process CPU seconds of a block (CPU time is steadier on a shared, busy machine)."""

    def __enter__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu


def plain_generate(lm, ids: list[int], n_new: int) -> tuple[float, list[int]]:
    """transformers' own greedy generate with SDPA, no stop token: its Clock and the new token ids."""
    cfg = copy.deepcopy(lm.model.generation_config)
    cfg.eos_token_id = None
    cfg.do_sample, cfg.max_new_tokens, cfg.min_new_tokens = False, n_new, None
    cfg.temperature = cfg.top_p = cfg.top_k = None
    cfg.pad_token_id = lm.tokenizer.pad_token_id or 0
    x = torch.tensor([ids], device=lm.device)
    assert lm.model.config._attn_implementation == "sdpa", "the baseline must be plain SDPA"
    with torch.inference_mode(), Clock() as clock:
        out = lm.model.generate(x, attention_mask=torch.ones_like(x), generation_config=cfg)
    return clock, [int(i) for i in out[0, len(ids) :]]


def own_loop(lm, ids: list[int], n_new: int) -> tuple[float, list[int]]:
    """kvviz's prefill/decode loop with no capture installed (plain SDPA): its Clock and the new ids."""
    out: list[int] = []
    with torch.inference_mode(), Clock() as clock:
        cache = DynamicCache(config=lm.config)
        feed, start = ids, 0
        for _ in range(n_new):
            out.append(int(torch.argmax(forward(lm, feed, start, cache, None)[-1])))
            feed, start = out[-1:], start + len(feed)
    return clock, out


def captured(lm, ids: list[int], n_new: int) -> tuple[float, list[int], dict]:
    """kvviz's capture (own loop + recorder), greedy, no stop token: its Clock, new ids, the trace timings."""
    with Clock() as clock:
        trace = capture(never_stopping(lm), "", chat=False, prompt_ids=ids, max_new_tokens=n_new)
    return clock, trace.token_ids[len(ids) :], trace.timings


def run_case(lm, n_prompt: int, n_new: int, repeats: int) -> dict:
    """Interleave the three runs (rotating which goes first) and compare medians."""
    ids = chapter_prompt_ids(lm.tokenizer, n_prompt)
    times: dict[str, list[float]] = {"generate": [], "own_loop": [], "capture": []}
    cpu: dict[str, list[float]] = {k: [] for k in times}
    prefill_s = []
    for r in range(repeats):
        names = list(times)
        for which in names[r % 3 :] + names[: r % 3]:
            if which == "generate":
                seconds, gen_ids = plain_generate(lm, ids, n_new)
            elif which == "own_loop":
                seconds, own_ids = own_loop(lm, ids, n_new)
            else:
                seconds, cap_ids, timings = captured(lm, ids, n_new)
                prefill_s.append(timings["prefill_s"])
            times[which].append(seconds.wall)
            cpu[which].append(seconds.cpu)
        if not gen_ids == own_ids == cap_ids:
            raise AssertionError(f"capture and plain generation disagree at {n_prompt}+{n_new} tokens")
    med = {k: statistics.median(v) for k, v in times.items()}
    cpu_med = {k: statistics.median(v) for k, v in cpu.items()}
    return {
        "prompt_tokens": n_prompt,
        "new_tokens": n_new,
        "repeats": repeats,
        "same_tokens": True,
        "plain_s": times["generate"],
        "own_loop_s": times["own_loop"],
        "capture_s": times["capture"],
        "capture_prefill_s": prefill_s,
        "plain_median_s": med["generate"],
        "own_loop_median_s": med["own_loop"],
        "capture_median_s": med["capture"],
        "ratio_of_medians": med["capture"] / med["generate"],
        "ratio_vs_own_loop": med["capture"] / med["own_loop"],
        "median_pair_ratio": statistics.median(c / p for c, p in zip(times["capture"], times["generate"])),
        "median_pair_ratio_vs_own_loop": statistics.median(c / p for c, p in zip(times["capture"], times["own_loop"])),
        "cpu_s": cpu,
        "cpu_ratio_vs_generate": cpu_med["capture"] / cpu_med["generate"],
        "cpu_ratio_vs_own_loop": cpu_med["capture"] / cpu_med["own_loop"],
        "target_ratio": TARGET_RATIO,
    }


def table(rows: list[dict]) -> str:
    out = [
        f"{'case':>12} {'generate (s)':>13} {'own loop (s)':>13} {'capture (s)':>12} {'vs generate':>12} "
        f"{'vs own loop':>12} {'CPU-time ratios':>16}  target ≤ {TARGET_RATIO}×"
    ]
    for r in rows:
        worst = r["ratio_of_medians"]  # the target is against transformers' generate; vs own loop is shown beside it
        out.append(
            f"{r['prompt_tokens']:>6}+{r['new_tokens']:<5} {r['plain_median_s']:>13.2f} "
            f"{r['own_loop_median_s']:>13.2f} {r['capture_median_s']:>12.2f} {r['ratio_of_medians']:>11.2f}× "
            f"{r['ratio_vs_own_loop']:>11.2f}× {r['cpu_ratio_vs_generate']:>7.2f}×/{r['cpu_ratio_vs_own_loop']:.2f}×  "
            f"{'met' if worst <= TARGET_RATIO else 'MISSED'}"
        )
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
    warm = chapter_prompt_ids(lm.tokenizer, 32)  # warm-up: first calls pay one-off costs
    plain_generate(lm, warm, 2), own_loop(lm, warm, 2), captured(lm, warm, 2)
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
