"""A lecture hall at once: N simulated students call ``/generate`` through gradio_client together.

Run: ``.venv/bin/python bench/load.py [--students 8 32 32] [--new-tokens 6] [--url URL]``.
Without ``--url`` it starts ``python app.py`` on a free port (the server's RSS is then measured).
Each student has their own prompt and client (= session). Every answer must equal a solo run of
the same prompt (greedy), with no error, and the app must still answer afterwards. Reports p50/p95
latency per wave and the server's RSS growth (after the sessions have closed); a repeated wave shows
whether memory keeps growing.
Results go to ``bench/results/load.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
from gradio_client import Client

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
SUBJECTS = [
    "the sea",
    "a red fox",
    "winter",
    "an old clock",
    "the moon",
    "bread",
    "a quiet library",
    "rain",
    "a mountain",
    "coffee",
    "a lost key",
    "the desert",
    "a violin",
    "autumn leaves",
    "a robot",
    "fire",
    "a small boat",
    "the city at night",
    "snow",
    "a garden",
    "an owl",
    "thunder",
    "a train",
    "honey",
    "a lighthouse",
    "the wind",
    "a cat",
    "summer",
    "a bridge",
    "stars",
    "a river",
    "a candle",
]


def prompt_for(i: int) -> str:
    """Student i's own prompt (distinct for i < 64, so answers can be told apart)."""
    return f"Student {i + 1} writes one sentence about {SUBJECTS[i % len(SUBJECTS)]}:"


def start_server(env_extra: dict[str, str]) -> tuple[subprocess.Popen, str, Path]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tmp = Path(tempfile.mkdtemp(prefix="kvviz-load-"))
    env = {
        **os.environ,
        "GRADIO_TEMP_DIR": str(tmp),
        "TMPDIR": str(tmp),
        "GRADIO_ANALYTICS_ENABLED": "False",
        **env_extra,
    }
    with open(tmp / "app.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "app.py", "--host", "127.0.0.1", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"app.py exited: {(tmp / 'app.log').read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return proc, url, tmp
        except OSError:
            time.sleep(0.5)
    proc.terminate()
    raise RuntimeError("app.py did not start within 180 s")


def rss_mib(pid: int | None) -> float | None:
    if pid is None:
        return None
    proc = psutil.Process(pid)
    return sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)]) / 2**20


def client(url: str) -> Client:
    """One student's session. httpx's default 5 s timeout would count a busy server's slow reply as
    a failure; a browser waits, so the bench waits too (up to 120 s per request)."""
    return Client(url, verbose=False, httpx_kwargs={"timeout": 120})


def ask(url: str, prompt: str, new_tokens: int) -> dict:
    return client(url).predict(prompt, new_tokens, False, 0.0, 1.0, 0, api_name="/generate")


def wave(url: str, n: int, new_tokens: int, solo: dict[str, str]) -> dict:
    """n students at once (a barrier releases them together); checks each answer against its solo run."""
    barrier = threading.Barrier(n)
    clients = [None] * n

    def student(i: int) -> tuple[float, str | None, str | None]:
        clients[i] = client(url)  # connect first, like students opening the page
        barrier.wait()
        t0 = time.perf_counter()
        try:
            out = clients[i].predict(prompt_for(i), new_tokens, False, 0.0, 1.0, 0, api_name="/generate")
            return time.perf_counter() - t0, out["text"], None
        except Exception as exc:  # every failure is counted and reported, none is hidden
            return time.perf_counter() - t0, None, f"{type(exc).__name__}: {exc}"

    t0 = time.perf_counter()
    with ThreadPoolExecutor(n) as pool:
        results = list(pool.map(student, range(n)))
    wall = time.perf_counter() - t0
    lat = sorted(r[0] for r in results)
    errors = [r[2] for r in results if r[2]]
    wrong = [i for i, r in enumerate(results) if r[1] is not None and r[1] != solo[prompt_for(i)]]
    return {
        "students": n,
        "wall_s": round(wall, 1),
        "p50_s": round(statistics.median(lat), 2),
        "p95_s": round(lat[min(n - 1, int(round(0.95 * (n - 1))))], 2),
        "max_s": round(lat[-1], 2),
        "errors": errors,
        "wrong_answers": wrong,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--students", type=int, nargs="+", default=[8, 32, 32])
    ap.add_argument("--new-tokens", type=int, default=6)
    ap.add_argument(
        "--settle-s",
        type=float,
        default=20.0,
        help="idle seconds after each wave before reading RSS (the server notices closed sessions "
        "at its next heartbeat, every 15 s)",
    )
    ap.add_argument("--url", help="load-test a running app instead of starting one (no RSS then)")
    args = ap.parse_args(argv)

    proc = None
    url = args.url
    if url is None:
        proc, url, _ = start_server({"KVVIZ_MAX_NEW_TOKENS": "64", "KVVIZ_QUEUE_SIZE": "128"})
    try:
        pid = proc.pid if proc else None
        n_max = max(args.students)
        t0 = time.perf_counter()
        solo = {prompt_for(i): ask(url, prompt_for(i), args.new_tokens)["text"] for i in range(n_max)}
        solo_s = (time.perf_counter() - t0) / n_max
        distinct = len(set(solo.values()))
        rss0 = rss_mib(pid)
        print(f"solo: {n_max} prompts, {solo_s:.2f} s each, {distinct} distinct answers; server RSS {rss0} MiB")
        waves = []
        for n in args.students:
            w = wave(url, n, args.new_tokens, solo)
            gc.collect()  # closes this wave's clients; let the server see their sessions end before measuring
            time.sleep(args.settle_s)
            w["rss_mib_after"] = None if pid is None else round(rss_mib(pid), 1)
            waves.append(w)
            print(
                f"{n:3d} students: wall {w['wall_s']} s, p50 {w['p50_s']} s, p95 {w['p95_s']} s, "
                f"errors {len(w['errors'])}, wrong {len(w['wrong_answers'])}, RSS {w['rss_mib_after']} MiB"
            )
        with urllib.request.urlopen(url, timeout=10) as r:
            up = r.status == 200
        again = ask(url, prompt_for(0), args.new_tokens)["text"] == solo[prompt_for(0)]
        rss_idle = rss_mib(pid)
        report = {
            "new_tokens": args.new_tokens,
            "cpu_cores": os.cpu_count(),
            "solo_s_per_request": round(solo_s, 2),
            "distinct_solo_answers": distinct,
            "rss_mib_before": None if rss0 is None else round(rss0, 1),
            "waves": waves,
            "app_up_after": up,
            "answer_after_matches_solo": again,
        }
        if rss0 is not None:
            report["rss_mib_after_idle"] = round(rss_idle, 1)
            report["rss_growth_mib"] = round(rss_idle - rss0, 1)
            if len(waves) >= 2:
                report["rss_growth_last_wave_mib"] = round(waves[-1]["rss_mib_after"] - waves[-2]["rss_mib_after"], 1)
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "load.json").write_text(json.dumps(report, indent=2) + "\n")
        ok = up and again and all(not w["errors"] and not w["wrong_answers"] for w in waves)
        print(json.dumps({k: v for k, v in report.items() if k != "waves"}, indent=2))
        print("PASS" if ok else "FAIL")
        return 0 if ok else 1
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
