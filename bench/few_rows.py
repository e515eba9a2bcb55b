"""The few-rows route (``kvviz.engine.few_rows``) against ``F.linear``, on the bundled model's weights.

Two measurements, each interleaved so the machine's drift falls on both sides alike:
1. every weight shape of the model (q/o, k/v, gate/up, down, lm_head) at 1–200 rows: median time of
   ``F.linear`` and of the transposed product, and the sum over one forward's 211 linear calls;
2. the engine's decode steps with 24 runs decoding together (chat, 16 new tokens), the route turned
   on for every other packed step: median step time with and without it.

Run: ``.venv/bin/python bench/few_rows.py [--repeats 30]``. Writes ``bench/results/few_rows.json`` (ms).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import Counter

import torch
import torch.nn.functional as F
from _common import RESULTS

import kvviz.engine.engine as engine_mod
from kvviz.engine.engine import Engine
from kvviz.engine.few_rows import ROWS, transposed_product
from kvviz.models import load_model

ROW_COUNTS = [1, 8, 12, 16, 24, 32, 48, 56, 64, 128, 200]


def timed(fn, repeats: int) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t) / repeats * 1e3


def shapes(model) -> Counter:
    """How many linear calls of each weight shape one forward makes."""
    return Counter(tuple(m.weight.shape) for m in model.modules() if isinstance(m, torch.nn.Linear))


def per_shape(model, repeats: int) -> dict:
    weights = {tuple(m.weight.shape): m.weight.detach() for m in model.modules() if isinstance(m, torch.nn.Linear)}
    counts, out = shapes(model), {}
    for rows in ROW_COUNTS:
        plain = fast = 0.0
        for shape, w in weights.items():
            x = torch.randn(rows, shape[1])
            a = statistics.median(timed(lambda x=x, w=w: F.linear(x, w), repeats) for _ in range(3))
            b = statistics.median(timed(lambda x=x, w=w: transposed_product(x, w, None), repeats) for _ in range(3))
            out[f"{shape[0]}x{shape[1]} @ {rows} rows"] = {"f_linear_ms": round(a, 4), "transposed_ms": round(b, 4)}
            plain += a * counts[shape]
            fast += b * counts[shape]
        out[f"one forward's linears @ {rows} rows"] = {"f_linear_ms": round(plain, 2), "transposed_ms": round(fast, 2)}
        print(f"{rows:4d} rows: one forward's linears F.linear {plain:7.1f} ms, transposed {fast:7.1f} ms")
    return out


def engine_steps(lm, waves: int) -> dict:
    """Median decode-step time of 24 runs with the route on for every other packed step, and off."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from load import prompt_for

    real = engine_mod.few_rows
    flip = {"n": 0, "on": False}
    times: dict[bool, list[float]] = {True: [], False: []}

    def alternating():
        flip["n"] += 1
        flip["on"] = flip["n"] % 2 == 0
        return real() if flip["on"] else _nothing()

    engine_mod.few_rows = alternating
    original_step = Engine._step

    def step(self, batch):
        t = time.perf_counter()
        original_step(self, batch)
        if len(batch) in ROWS and not any(j.gen.prefilling for j in batch):
            times[flip["on"]].append(time.perf_counter() - t)

    Engine._step = step
    try:
        engine = Engine(lm)
        engine.submit("Hello", chat=True, max_new_tokens=2).result()
        for wave in range(waves):
            handles = [engine.submit(prompt_for(i, wave), chat=True, max_new_tokens=16) for i in range(24)]
            for h in handles:
                h.result()
    finally:
        engine_mod.few_rows = real
        Engine._step = original_step
    on, off = statistics.median(times[True]) * 1e3, statistics.median(times[False]) * 1e3
    print(f"engine decode step, 24 runs: {off:.0f} ms without the route, {on:.0f} ms with it")
    return {
        "steps_each": min(len(times[True]), len(times[False])),
        "without_ms": round(off, 1),
        "with_ms": round(on, 1),
    }


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--waves", type=int, default=3)
    args = ap.parse_args()
    lm = load_model()
    with torch.inference_mode():
        shapes_ms = per_shape(lm.model, args.repeats)
    report = {
        "threads": torch.get_num_threads(),
        "route_rows": [ROWS.start, ROWS.stop - 1],
        "per_shape": shapes_ms,
        "engine": engine_steps(lm, args.waves),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "few_rows.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
