"""Time to first token for a 2K-token prompt: computed, from the prefix store's memory, from its disk tier.

Run: ``.venv/bin/python bench/prefix_tiers.py [--tokens 2048] [--tries 3]``. The bundled model in the
engine, one run of one new token at a time; a 2,048-token slice of the source chapter per try (another
slice each try, so a computed run finds nothing). Per try: the prompt computed, the same prompt again
(its blocks in memory), a second prompt that pushes the first one's blocks out of memory (room for one
prompt: 100 MiB) onto the disk tier, then the first prompt again (its blocks read back from disk). Each
run's Trace says where its prompt tokens came from; the bench checks that, and times the run from submit
until its first token is in the Trace. Runs without a recorder (the store keeps keys and values only:
attention rows for 2K queries would be ~2 GiB). Writes ``bench/results/prefix_tiers.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from _common import RESULTS, chapter_prompt_ids

from kvviz.engine.disk_tier import DiskTier
from kvviz.engine.engine import Engine
from kvviz.models import load_model

MEMORY_BYTES = 100 * 2**20  # one 2K-token prompt's blocks of SmolLM2 (~94 MB of keys and values)


def ttft(engine: Engine, ids: list[int]) -> tuple[float, dict]:
    """Seconds from submit until the run's first token is in its Trace, and where its prompt came from."""
    t0 = time.perf_counter()
    h = engine.submit("", prompt_ids=ids, chat=False, max_new_tokens=1, record=False)
    while not h.trace.steps and not h.run.finished:
        time.sleep(0.0005)
    seconds = time.perf_counter() - t0
    h.result()
    return seconds, h.trace.source_counts()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--tries", type=int, default=3)
    ap.add_argument("--out", default=str(RESULTS / "prefix_tiers.json"))
    args = ap.parse_args(argv)
    lm = load_model()
    text = chapter_prompt_ids(lm.tokenizer, args.tokens + 64 * (2 * args.tries + 1))
    times: dict[str, list[float]] = {"computed": [], "memory": [], "disk": []}
    with tempfile.TemporaryDirectory() as folder:
        disk = DiskTier(folder, 1024 * 2**20)
        engine = Engine(lm, prefix_cache_bytes=MEMORY_BYTES, prefix_disk=disk, keep_finished=0)
        engine.warm("Hello", chat=False)  # the first forward's allocations behind us
        for i in range(args.tries):
            first = text[128 * i : 128 * i + args.tokens]
            other = text[128 * i + 64 : 128 * i + 64 + args.tokens]
            for tier, ids in [("computed", first), ("memory", first), (None, other), ("disk", first)]:
                seconds, counts = ttft(engine, ids)
                if tier is None:
                    continue
                main_source = max(counts, key=lambda k: counts[k])
                if main_source != tier:
                    print(f"try {i}: expected a {tier} run, its prompt came from {counts}")
                    return 1
                times[tier].append(seconds)
                print(f"try {i}: {tier:8s} {seconds:6.3f} s  {counts}")
        stats = engine.snapshot()["prefix_cache"]
        engine.close()
    median = {k: statistics.median(v) for k, v in times.items()}
    report = {
        "model": lm.name,
        "device": str(lm.device),
        "prompt_tokens": args.tokens,
        "tries": args.tries,
        "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg(),
        "ttft_s": times,
        "median_ttft_s": median,
        "speedup_vs_computed": {k: median["computed"] / v for k, v in median.items()},
        "disk_bytes_written": stats.get("disk_written_bytes"),
        "disk_blocks_read": stats.get("disk_read_blocks"),
    }
    with open(args.out, "w") as fh:
        fh.write(json.dumps(report, indent=2) + "\n")
    for k, v in median.items():
        print(f"median {k:8s} {v:6.3f} s  ({median['computed'] / v:.1f}× faster than computed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
