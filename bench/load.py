"""A lecture hall at once: N simulated students call ``/generate`` together (gradio_client or plain HTTP).

Run: ``.venv/bin/python bench/load.py [--students 24 24] [--same 100] [--new-tokens 16] [--url URL]
[--client gradio|http]``. Without ``--url`` it starts ``python app.py`` on a free port (the server's RSS is
then measured).
Each student has their own client (= session) and presses Generate through the chat template: first
waves of distinct one-line questions (all at once), then ``--same`` students pressing the same example
within ``--same-spread-s`` seconds. Every answer must equal a solo run of the same prompt (greedy),
with no error, and the app must still answer afterwards. Reports p50/p95 latency per wave (press to
full answer, the equivalence check included), the server's RSS after each wave (a repeated wave shows
whether memory keeps growing), and the engine's prefix-cache hit rate and bytes held. During the first
wave a visitor of its own sends bad input to ``/memory`` (a context of 10¹⁵, a batch of −3) and times
its refusal: bad input must be refused at once while a room runs.
Results go to ``bench/results/load.json`` (``--out``: a run kept for the docs is named for what it measures,
e.g. ``load_epyc_8_token_blocks_http.json``).

The students' clients run in this process, on the server's machine — in a lecture each browser has a
machine of its own. ``--client gradio`` (the default) gives each student a ``gradio_client.Client``, the
way the figures have always been measured; they share one TLS context (see ``TLS``), and on the 2-core
machine 24 of them still take ~0.2 s of the cores during a wave, 100 more while they arrive. ``--client http`` presses with
plain HTTP against the app's REST route (``POST /gradio_api/call/generate``, then its event stream),
the same queue and handler at a few milliseconds of client work each, so the figures are the server's.
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

import httpx
import psutil
from gradio_client import Client

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# the room's prompts (the Blocks tab and bench/page_sizes.py replay them too)
from kvviz.examples.room import SAME_EXAMPLE, prompt_for  # noqa: E402


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


# One TLS setup for every simulated student. gradio_client opens a new httpx client for each request and,
# given ``ssl_verify=True``, httpx loads the CA bundle again each time (some 20-40 ms of CPU, even for a plain
# http:// URL): 24 students spent ~2 s of the server's two cores on it during a wave. A browser loads its
# certificates once per visit, and a lecture's browsers are not on the server's machine at all.
TLS = httpx.create_ssl_context()


def client(url: str) -> Client:
    """One student's session. httpx's default 5 s timeout would count a busy server's slow reply as
    a failure; a browser waits, so the bench waits too (up to 120 s per request)."""
    return Client(url, verbose=False, httpx_kwargs={"timeout": 120}, ssl_verify=TLS)  # type: ignore[arg-type]


def ask(url: str, prompt: str, new_tokens: int) -> dict:
    return client(url).predict(prompt, new_tokens, True, 0.0, 1.0, 0, api_name="/generate")


class HttpStudent:
    """A student pressing Generate with plain HTTP: the REST route's POST, then its event stream, read
    until the ``complete`` event (its data: the endpoint's outputs, a JSON list) or an ``error``."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")
        self.http = httpx.Client(timeout=120)

    def predict(self, *data, api_name: str) -> dict:
        route = f"{self.url}/gradio_api/call{api_name}"
        posted = self.http.post(route, json={"data": list(data)})
        posted.raise_for_status()
        event: str | None = None
        body: list[str] = []
        with self.http.stream("GET", f"{route}/{posted.json()['event_id']}") as stream:
            for line in stream.iter_lines():
                if line.startswith("event:"):
                    event, body = line[6:].strip(), []
                elif line.startswith("data:"):
                    body.append(line[5:].strip())
                elif not line and event in ("complete", "error"):
                    break
        text = "\n".join(body)
        if event != "complete":
            raise RuntimeError(f"the server answered {event}: {text[:300]}")
        return json.loads(text)[0]


BAD_INPUTS = ({"context": 10**15}, {"batch": -3})  # what /memory must refuse at once, the room running or not
BAD_AFTER_S = 1.5  # into the wave: the room's prompts are in the engine by then


def bad_input(c: Client) -> list[dict]:
    """Send /memory each of :data:`BAD_INPUTS`: the seconds until it was refused, and whether it was."""
    out = []
    for bad in BAD_INPUTS:
        t0 = time.perf_counter()
        try:
            c.predict("Llama-3-8B", **{"context": 8192, "batch": 1, **bad}, api_name="/memory")
            refused = False
        except Exception:  # gradio_client raises the server's error
            refused = True
        out.append({"input": bad, "refused": refused, "seconds": round(time.perf_counter() - t0, 3)})
    return out


def wave(
    url: str,
    prompts: list[str],
    new_tokens: int,
    solo: dict[str, str],
    spread_s: float = 0.0,
    kind: str = "gradio",
    probe_bad: bool = False,
) -> dict:
    """One student per prompt: all at once (a barrier releases them together), or arriving evenly over
    ``spread_s`` seconds; checks each answer against its solo run. Latency: press to full answer.
    ``probe_bad``: a visitor of its own sends bad input to ``/memory`` :data:`BAD_AFTER_S` into the wave."""
    n = len(prompts)
    barrier = threading.Barrier(n + probe_bad)
    clients: list[Client | HttpStudent | None] = [None] * n

    def student(i: int) -> tuple[float, str | None, str | None, int]:
        clients[i] = client(url) if kind == "gradio" else HttpStudent(url)  # connect first, like opening the page
        barrier.wait()
        time.sleep(spread_s * i / max(n - 1, 1))
        t0 = time.perf_counter()
        try:
            out = clients[i].predict(prompts[i], new_tokens, True, 0.0, 1.0, 0, api_name="/generate")
            return time.perf_counter() - t0, out["text"], None, out.get("cached_prompt_tokens", 0)
        except Exception as exc:  # every failure is counted and reported, none is hidden
            return time.perf_counter() - t0, None, f"{type(exc).__name__}: {exc}", 0

    def visitor() -> list[dict]:
        c = client(url)
        barrier.wait()
        time.sleep(BAD_AFTER_S)
        return bad_input(c)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(n + probe_bad) as pool:
        probe = pool.submit(visitor) if probe_bad else None
        results = list(pool.map(student, range(n)))
        refusals = probe.result() if probe is not None else None
    wall = time.perf_counter() - t0
    lat = sorted(r[0] for r in results)
    errors = [r[2] for r in results if r[2]]
    wrong = [i for i, r in enumerate(results) if r[1] is not None and r[1] != solo[prompts[i]]]
    return {
        "students": n,
        "distinct_prompts": len(set(prompts)),
        "spread_s": spread_s,
        "wall_s": round(wall, 1),
        "p50_s": round(statistics.median(lat), 2),
        "p95_s": round(lat[min(n - 1, int(round(0.95 * (n - 1))))], 2),
        "max_s": round(lat[-1], 2),
        "cached_prompt_tokens_mean": round(statistics.mean(r[3] for r in results), 1),
        "errors": errors,
        "wrong_answers": wrong,
        **({"bad_input_during_wave": refusals} if refusals is not None else {}),
    }


def engine_stats(url: str) -> dict | None:
    """The server engine's counters and prefix-cache statistics (None for an app without the engine)."""
    try:
        return client(url).predict(api_name="/engine")
    except Exception:
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--students", type=int, nargs="+", default=[24, 24], help="waves of distinct questions")
    ap.add_argument("--same", type=int, default=100, help="students pressing the same example (0: none)")
    ap.add_argument("--same-spread-s", type=float, default=10.0, help="seconds over which they press it")
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument(
        "--settle-s",
        type=float,
        default=20.0,
        help="idle seconds after each wave before reading RSS (the server notices closed sessions "
        "at its next heartbeat, every 15 s)",
    )
    ap.add_argument("--url", help="load-test a running app instead of starting one (no RSS then)")
    ap.add_argument(
        "--client",
        choices=["gradio", "http"],
        default="gradio",
        help="each student's client: a gradio_client.Client, or plain HTTP (see the module docstring)",
    )
    ap.add_argument("--out", default="load.json", help="file name under bench/results/")
    args = ap.parse_args(argv)

    proc = None
    url = args.url
    if url is None:
        # the show-me examples are computed before a lecture starts; here they would share the cores with the waves
        proc, url, _ = start_server({"KVVIZ_MAX_NEW_TOKENS": "64", "KVVIZ_QUEUE_SIZE": "128", "KVVIZ_PRECOMPUTE": "0"})
    try:
        pid = proc.pid if proc else None
        plan = [([prompt_for(i, k) for i in range(n)], 0.0) for k, n in enumerate(args.students)]
        if args.same:
            plan.append(([SAME_EXAMPLE] * args.same, args.same_spread_s))
        # the reference answers come from the library in this process, one run at a time (never from the
        # server, which may share a run between identical requests)
        sys.path.insert(0, str(ROOT))
        from kvviz.capture.loop import capture
        from kvviz.models import load_model

        lm = load_model()
        prompts = sorted({p for ps, _ in plan for p in ps})
        t0 = time.perf_counter()
        solo = {p: capture(lm, p, chat=True, max_new_tokens=args.new_tokens).text for p in prompts}
        solo_s = (time.perf_counter() - t0) / len(prompts)
        distinct = len(set(solo.values()))
        del lm
        gc.collect()
        n_max = len(prompts)
        rss0 = rss_mib(pid)
        print(f"solo (library): {n_max} prompts, {solo_s:.2f} s each, {distinct} distinct answers; RSS {rss0} MiB")
        waves = []
        for prompts, spread in plan:
            w = wave(url, prompts, args.new_tokens, solo, spread, args.client, probe_bad=not waves)
            gc.collect()  # closes this wave's clients; let the server see their sessions end before measuring
            time.sleep(args.settle_s)
            w["rss_mib_after"] = None if pid is None else round(rss_mib(pid), 1)
            waves.append(w)
            print(
                f"{w['students']:3d} students ({w['distinct_prompts']} prompts, over {spread:g} s): wall "
                f"{w['wall_s']} s, p50 {w['p50_s']} s, p95 {w['p95_s']} s, errors {len(w['errors'])}, "
                f"wrong {len(w['wrong_answers'])}, cached prompt tokens {w['cached_prompt_tokens_mean']}, "
                f"RSS {w['rss_mib_after']} MiB"
                + (f"; bad input: {w['bad_input_during_wave']}" if "bad_input_during_wave" in w else "")
            )
        with urllib.request.urlopen(url, timeout=10) as r:
            up = r.status == 200
        again = ask(url, prompt_for(0), args.new_tokens)["text"] == solo[prompt_for(0)]
        load_avg = os.getloadavg()
        rss_idle = rss_mib(pid)
        report = {
            "client": args.client,
            "new_tokens": args.new_tokens,
            "chat": True,
            "cpu_cores": os.cpu_count(),
            "load_average_at_end": load_avg,
            "solo_s_per_request": round(solo_s, 2),
            "distinct_solo_answers": distinct,
            "rss_mib_before": None if rss0 is None else round(rss0, 1),
            "waves": waves,
            "engine": engine_stats(url),
            "app_up_after": up,
            "answer_after_matches_solo": again,
        }
        if rss0 is not None:
            report["rss_mib_after_idle"] = round(rss_idle, 1)
            report["rss_growth_mib"] = round(rss_idle - rss0, 1)
            if len(waves) >= 2:
                report["rss_growth_last_wave_mib"] = round(waves[-1]["rss_mib_after"] - waves[-2]["rss_mib_after"], 1)
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / args.out).write_text(json.dumps(report, indent=2) + "\n")
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
