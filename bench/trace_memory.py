"""Bytes a capture keeps (the Trace) vs the KV cache's own bytes vs what output_attentions=True would hold.

Run: ``.venv/bin/python bench/trace_memory.py [--prompt-tokens 4096] [--new-tokens 256]``.
Target (issue 4): at 4,096 + 256 tokens on the bundled model the trace holds at most 2× the cache.
Writes ``bench/results/trace_memory.json`` (all sizes in bytes).
"""

from __future__ import annotations

import argparse
import json
import time

from _common import RESULTS, chapter_prompt_ids, never_stopping

from kvviz.capture.loop import capture
from kvviz.capture.trace import _ARRAYS, ModelInfo
from kvviz.models import load_model
from kvviz.units import format_bytes

TARGET_RATIO = 2.0


def output_attentions_bytes(info: ModelInfo, n_prompt: int, n_new: int) -> int:
    """What ``generate(..., output_attentions=True)`` keeps for the same run, analytically.

    The prefill returns one [Hq, L, L] matrix per layer; each of the ``n_new - 1`` decode forwards
    returns [Hq, 1, t] with t = L+1 … L+n_new-1 (the last generated token is never fed back).
    Elements are in the model's dtype.
    """
    per_element = info.layers * info.q_heads * info.bytes_per_element
    decode = sum(n_prompt + s for s in range(1, n_new))
    return per_element * (n_prompt * n_prompt + decode)


def measure(lm, n_prompt: int, n_new: int, obs_window: int = 64) -> dict:
    """One capture of ``n_prompt`` chapter tokens + ``n_new`` greedy tokens; sizes in bytes."""
    from kvviz.capture.recorder import RecorderConfig

    ids = chapter_prompt_ids(lm.tokenizer, n_prompt)
    t0 = time.perf_counter()
    trace = capture(
        never_stopping(lm),
        "",
        chat=False,
        prompt_ids=ids,
        max_new_tokens=n_new,
        cfg=RecorderConfig(obs_window=obs_window),
    )
    seconds = time.perf_counter() - t0
    arrays = {n: int(getattr(trace, n).nbytes) for n in _ARRAYS if getattr(trace, n) is not None}
    kv = trace.cache_bytes
    return {
        "model": trace.model.name,
        "device": trace.model.device,
        "dtype": trace.model.dtype,
        "prompt_tokens": trace.n_prompt,
        "new_tokens": trace.n_generated,
        "tokens_in_cache": trace.n_fed,
        "bin_factor": trace.bin_factor,
        "obs_window": obs_window,
        "kv_cache_bytes": kv,
        "trace_bytes": trace.nbytes(),
        "trace_bytes_by_array": arrays,
        "trace_to_kv_ratio": trace.nbytes() / kv,
        "output_attentions_bytes": output_attentions_bytes(trace.model, trace.n_prompt, trace.n_generated),
        "capture_seconds": seconds,
        "target_ratio": TARGET_RATIO,
    }


def report(r: dict) -> str:
    lines = [
        f"{r['model']} ({r['dtype']}, {r['device']}): {r['prompt_tokens']:,} prompt + {r['new_tokens']} new tokens, "
        f"bin factor {r['bin_factor']}, window {r['obs_window']}, capture {r['capture_seconds']:.1f} s",
        f"  KV cache (its own tensors): {format_bytes(r['kv_cache_bytes']):>12}",
        f"  trace (all arrays):         {format_bytes(r['trace_bytes']):>12}  = {r['trace_to_kv_ratio']:.2f}× the cache "
        f"(target ≤ {r['target_ratio']:g}×: {'met' if r['trace_to_kv_ratio'] <= r['target_ratio'] else 'MISSED'})",
        f"  output_attentions=True:     {format_bytes(r['output_attentions_bytes']):>12}  "
        f"= {r['output_attentions_bytes'] / r['kv_cache_bytes']:,.0f}× the cache",
    ]
    lines += [f"    {name:<22} {format_bytes(b):>12}" for name, b in r["trace_bytes_by_array"].items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None, lm=None) -> dict:
    """Parse the arguments, measure, print and save (``lm``: an already loaded model to reuse)."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--prompt-tokens", type=int, default=4096)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--obs-window", type=int, default=64)
    p.add_argument("--out", default=str(RESULTS / "trace_memory.json"), help="JSON file to write ('' = none)")
    args = p.parse_args(argv)
    result = measure(lm or load_model(), args.prompt_tokens, args.new_tokens, args.obs_window)
    print(report(result))
    if args.out:
        from pathlib import Path

        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
