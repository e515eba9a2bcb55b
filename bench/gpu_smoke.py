"""One check of a CUDA machine: ``python bench/gpu_smoke.py [--device cuda|cpu] [--students 24] [--new-tokens 32]``.

Loads the bundled model (CUDA in bf16 by default where CUDA is there; ``--device cpu``: fp32) and runs, each
through the library's own calls: a capture with the equivalence check (cached decoding against full
recomputation), one eviction comparison (SnapKV against the full cache), one quantized generation (KIVI-2
against the full cache), and the lecture hall — ``--students`` distinct questions submitted to the serving
engine at once, the batching path the app's ``/generate`` takes, without HTTP. Then the bf16 path: on CUDA
the run above already was bf16; elsewhere the model is loaded again in bf16 on the same device and the
capture with its check runs once more. Prints one JSON summary (device name, dtypes, max |Δ logit|, each
check's verdict — tolerance of its dtype, greedy and top-5 agreement — tokens/s, p95 latency, peak GPU memory
from ``torch.cuda.max_memory_allocated``), then each check's verdict as the Generate tab words it; exit code 1
when a room's run failed or a check says the cache changed the output. Small sizes on the CPU let
``tests/test_bench_gpu_smoke.py`` run it end to end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import torch
from _common import chapter_prompt_ids

from kvviz.capture.loop import capture
from kvviz.engine.engine import Engine
from kvviz.eviction.compare import compare
from kvviz.eviction.policies import make_policy
from kvviz.figures.generate import equivalence_text
from kvviz.models import load_model
from kvviz.quant.cache import compare_generation
from kvviz.quant.schemes import kivi
from kvviz.settings import Settings

QUESTION = "What is a KV cache? Answer in one sentence."
SUBJECTS = ["the sea", "a red fox", "winter", "an old clock", "the moon", "bread", "rain", "a mountain"]


def question(i: int) -> str:
    """Student i's own question (distinct for every i)."""
    return f"Write one sentence about {SUBJECTS[i % len(SUBJECTS)]}." + " " * (i // len(SUBJECTS))


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued kernels before reading a clock (CUDA runs asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def checked(lm, new_tokens: int):
    """The chat question captured with the equivalence check: the trace and its verdict."""
    trace = capture(lm, QUESTION, chat=True, max_new_tokens=new_tokens, verify=True)
    synchronize(lm.device)
    return trace, {**trace.verdict(), "max_abs_logit_diff": (trace.equivalence or {}).get("max_abs_logit_diff")}


def room(lm, students: int, new_tokens: int) -> dict:
    """Every student's question submitted to one engine at once, as the served app's room does."""
    s = Settings()
    engine = Engine(lm, max_batch=s.batch_size, prefix_cache_bytes=s.prefix_cache_mb * 2**20)
    try:
        t0 = time.perf_counter()
        handles = [
            engine.submit(question(i), chat=True, max_new_tokens=new_tokens, verify=True) for i in range(students)
        ]

        def wait(h):
            try:
                trace = h.result()
                return time.perf_counter() - t0, trace.n_generated, None
            except Exception as exc:
                return time.perf_counter() - t0, 0, f"{type(exc).__name__}: {exc}"

        with ThreadPoolExecutor(students) as pool:
            results = list(pool.map(wait, handles))
        synchronize(lm.device)
        wall = time.perf_counter() - t0
    finally:
        engine.close()
    lat = sorted(r[0] for r in results)
    return {
        "students": students,
        "wall_s": round(wall, 2),
        "p50_s": round(statistics.median(lat), 2),
        "p95_s": round(lat[min(students - 1, round(0.95 * (students - 1)))], 2),
        "tokens_per_s": round(sum(r[1] for r in results) / wall, 1),
        "errors": [r[2] for r in results if r[2]],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None, help="cuda (default where available) or cpu")
    ap.add_argument("--students", type=int, default=24)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=512, help="the eviction comparison's prompt length (over 72)")
    args = ap.parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    t0 = time.perf_counter()
    lm = load_model(device=device, dtype="bf16" if device.startswith("cuda") else "fp32")
    cuda = lm.device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(lm.device)

    trace, verdict = checked(lm, args.new_tokens)
    eq = trace.equivalence or {}
    ids = chapter_prompt_ids(lm.tokenizer, args.prompt_tokens)
    budget = max(72, args.prompt_tokens // 4)  # SnapKV keeps its 64-token observation window whatever the budget
    evicted = compare(lm, ids, [make_policy("snapkv")], budget=budget, max_new_tokens=args.new_tokens)
    row = evicted.results[-1].row()
    quant = compare_generation(lm, "Name three colours.", kivi(2), max_new_tokens=args.new_tokens)
    hall = room(lm, args.students, args.new_tokens)
    if lm.dtype == torch.bfloat16:
        trace16, verdict16 = trace, verdict
    else:  # the bf16 path on this device: a second copy of the model, loaded in bf16
        lm16 = load_model(device=str(lm.device), dtype="bf16")
        trace16, verdict16 = checked(lm16, args.new_tokens)
        del lm16
    summary = {
        "device": str(lm.device),
        "device_name": torch.cuda.get_device_name(lm.device) if cuda else "cpu",
        "torch": torch.__version__,
        "model": lm.name,
        "model_dtype": str(lm.dtype).removeprefix("torch."),
        "kv_cache_dtype": str(lm.dtype).removeprefix("torch."),
        "quantized_kv": quant.scheme.name,
        "max_abs_logit_diff": eq.get("max_abs_logit_diff"),
        "max_abs_attn_output_diff": eq.get("max_abs_attn_output_diff"),
        "tolerance": eq.get("tolerance"),
        "verdict": verdict,
        "bf16_verdict": verdict16,
        "decode_tokens_per_s": trace.timings.get("decode_tokens_per_s"),
        "eviction": {
            "policy": row["policy"],
            "budget": budget,
            "top1_agreement": row["top1_agreement"],
            "mean_kl_nats": row["mean_kl_nats"],
            "cache_bytes": row["cache_bytes"],
            "full_cache_bytes": row["full_cache_bytes"],
        },
        "quantized": {
            "agreement": quant.agreement,
            "mean_kl_nats": quant.mean_kl,
            "packed_bytes": quant.packed_bytes,
            "full_cache_bytes": quant.full_cache_bytes,
        },
        "room": hall,
        "p95_s": hall["p95_s"],
        "tokens_per_s": hall["tokens_per_s"],
        "peak_gpu_memory_bytes": torch.cuda.max_memory_allocated(lm.device) if cuda else None,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    print(json.dumps(summary, indent=2))
    for t in [trace] if trace16 is trace else [trace, trace16]:
        print(f"\n[{t.model.dtype} on {t.model.device}] {equivalence_text(t)}", file=sys.stderr)
    changed = not (verdict.get("cache_changes_nothing") and verdict16.get("cache_changes_nothing"))
    return 1 if hall["errors"] or changed else 0


if __name__ == "__main__":
    sys.exit(main())
