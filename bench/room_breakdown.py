"""Where a room's seconds go: the room of ``bench/load.py`` run in this process, its parts taken away one at a time.

Run: ``.venv/bin/python bench/room_breakdown.py [--students 24] [--new-tokens 16] [--repeats 3]``.
The same 24 distinct chat questions (``kvviz.examples.room.prompt_for``, greedy) go to a fresh
:class:`~kvviz.engine.engine.Engine` set up as the app's (its batch, prefix store, gathering wait; warmed
with the chat template, as the app warms it) in four ways, interleaved ``--repeats`` times so the machine's
drift falls on each alike:

- **app**: what ``/generate`` asks of the engine (the recorder on, the equivalence check);
- **no check**: the recorder on, no check (the check's cost is the difference);
- **no recorder**: neither (the recorder's cost is the difference);
- **library**: the same prompts through one padded, batched ``model.generate`` (no kvviz at all): the
  machine's own limit for this work.

For the engine's ways it reports each run's seconds from submission to its answer (p50 / p95, as
``bench/load.py`` reports them through the server) and where the engine's thread spent the wave
(``Engine.seconds``: gathering, steps that fed prompts, decode-only steps, checks). Through the server,
``bench/load.py`` adds the request path (Gradio's queue, the gate, streaming to the clients): its p95
minus this one's **app** p95. Writes ``bench/results/room_breakdown.json``. Run it alone on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import torch
from _common import RESULTS

from kvviz.engine.engine import Engine
from kvviz.examples.room import prompt_for
from kvviz.models import load_model
from kvviz.settings import Settings

WAYS = {  # name → the engine's keywords for each run (None: the library's batched generate)
    "app": {"verify": True},
    "no check": {"verify": False},
    "no recorder": {"verify": False, "record": False},
    "library": None,
}


def engine_for(lm) -> Engine:
    """An engine set up as the served app's (``kvviz.ui.serving.context``), warmed as the app warms it."""
    s = Settings.from_env()
    engine = Engine(
        lm,
        max_batch=s.batch_size,
        prefix_cache_bytes=s.prefix_cache_mb * 2**20,
        gather_s=s.gather_ms / 1000,
        gather_max_s=3 * s.gather_ms / 1000,
    )
    engine.warm("Hello")
    return engine


def engine_wave(lm, prompts: list[str], new_tokens: int, extra: dict) -> dict:
    engine = engine_for(lm)
    before = dict(engine.seconds)
    t0 = time.perf_counter()
    handles = [engine.submit(p, chat=True, max_new_tokens=new_tokens, **extra) for p in prompts]
    ends = [0.0] * len(handles)

    def follow(i: int) -> None:  # each run's own end, seen as it happens
        handles[i].run.ended.wait()
        ends[i] = time.perf_counter() - t0

    with ThreadPoolExecutor(len(handles)) as pool:
        list(pool.map(follow, range(len(handles))))
    wall = time.perf_counter() - t0
    texts = [h.result().text for h in handles]
    lat = sorted(ends)
    engine.close()
    spent = {k: round(engine.seconds[k] - before[k], 2) for k in engine.seconds}
    return {
        "wall_s": round(wall, 2),
        "p50_s": round(statistics.median(lat), 2),
        "p95_s": round(lat[min(len(lat) - 1, int(round(0.95 * (len(lat) - 1))))], 2),
        "engine_seconds": spent,
        "texts": texts,
    }


def library_wave(lm, prompts: list[str], new_tokens: int) -> dict:
    """One padded batch through ``model.generate``: greedy, the chat template, no capture, no check."""
    tok = lm.tokenizer
    texts = [
        tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        for p in prompts
    ]
    side = tok.padding_side
    tok.padding_side = "left"
    try:
        batch = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    finally:
        tok.padding_side = side
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = lm.model.generate(**batch, max_new_tokens=new_tokens, do_sample=False, pad_token_id=tok.pad_token_id)
    wall = time.perf_counter() - t0
    answers = [tok.decode(row[batch["input_ids"].shape[1] :], skip_special_tokens=True) for row in out]
    return {"wall_s": round(wall, 2), "p50_s": round(wall, 2), "p95_s": round(wall, 2), "texts": answers}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--students", type=int, default=24)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    lm = load_model()
    prompts = [prompt_for(i) for i in range(args.students)]
    runs: dict[str, list[dict]] = {way: [] for way in WAYS}
    for r in range(args.repeats):
        for way, extra in WAYS.items():
            res = (
                engine_wave(lm, prompts, args.new_tokens, extra)
                if extra is not None
                else library_wave(lm, prompts, args.new_tokens)
            )
            runs[way].append(res)
            print(
                f"repeat {r} {way:>12}: wall {res['wall_s']:.2f} s, p50 {res['p50_s']:.2f}, p95 {res['p95_s']:.2f}"
                + (f"  engine {res['engine_seconds']}" if "engine_seconds" in res else ""),
                flush=True,
            )
    same = all(
        runs["app"][0]["texts"] == res["texts"] for way in ("app", "no check", "no recorder") for res in runs[way]
    )
    report: dict = {
        "students": args.students,
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
        "threads": torch.get_num_threads(),
        "engine_answers_equal": same,
        "ways": {},
    }
    for way, results in runs.items():
        med = {k: statistics.median(r[k] for r in results) for k in ("wall_s", "p50_s", "p95_s")}
        row = {
            **{k: round(v, 2) for k, v in med.items()},
            "runs": [{k: v for k, v in r.items() if k != "texts"} for r in results],
        }
        if "engine_seconds" in results[0]:
            row["engine_seconds"] = {
                k: round(statistics.median(r["engine_seconds"][k] for r in results), 2)
                for k in results[0]["engine_seconds"]
            }
        report["ways"][way] = row
    w = report["ways"]
    report["check_s"] = round(w["app"]["p95_s"] - w["no check"]["p95_s"], 2)
    report["recorder_s"] = round(w["no check"]["p95_s"] - w["no recorder"]["p95_s"], 2)
    report["engine_over_library_s"] = round(w["no recorder"]["p95_s"] - w["library"]["p95_s"], 2)
    print(json.dumps({k: v for k, v in report.items() if k != "ways"}, indent=1))
    for way, row in w.items():
        print(
            f"{way:>12}: p50 {row['p50_s']:.2f} s, p95 {row['p95_s']:.2f} s, wall {row['wall_s']:.2f} s "
            + str(row.get("engine_seconds", ""))
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "room_breakdown.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
