"""A hostile visitor beside a lecture hall: the attacks of issues 31 and 38 against a public-mode server while a
room of students generates, and what the students saw.

Run: ``.venv/bin/python bench/hostile.py [--students 24] [--new-tokens 16] [--flood 200]`` (``--smoke``: a tiny
room and small attacks, to check the script works). It starts
``python app.py`` in public mode (``KVVIZ_PUBLIC=1``, with ``KVVIZ_MCP=1``) on a free port, computes each student's answer alone
first (its solo run, with the library in this process, one at a time), then releases the room's presses together
while one attacker, from a network address of its own, sends:

1. ``/generate`` with a temperature too small to divide by (``"1e-38"``, ``5e-324``);
2. check steps alone, by ``fn_index`` through ``/gradio_api/queue/join``, never opening a heartbeat
   (Generate's and Eviction's buttons);
3. the Blocks tab's live prefix-cache refresh, by ``fn_index``, looking for another session's secret;
4. ``--flood`` bare ``/gradio_api/call/generate`` requests (each one a new session);
5. a bad value (``max_new_tokens = -5``), timed from send to its refusal;

then, still beside the room (:func:`round_two`):

6. ``/chat`` with its history as a JSON list of ``--history-messages`` messages of 200,000 characters, timed to its
   refusal, with the server's RSS before, at its peak and after;
7. two MCP sessions (``mcp-session-id`` one and two) each calling the generate tool at once;
8. ``/gradio_api/run/generate`` without a session, then the Blocks room view asked as session ``"anonymous"``;
9. the deep-link note for ``?tab=[x](http://…)``, ``![a](…/px.png)``, ``<img src=…>`` and a styled ``<b>``: any
   markup it would render;
10. a ``--upload-mb`` MiB file streamed to ``/gradio_api/upload``: its status and time;
11. ``/generate`` with ``top_p`` 1e-300 and 5e-324.

After the room, ``--long`` near-maximum prompts (``--long-tokens`` words, ``--long-new`` new tokens) arrive at
once from as many addresses: how many are admitted, each one's time from press to answer, and the server's RSS
during that wave and once it is over (a wave's freed memory must go back to the OS, not stay at its peak).

Reports: the students' answers against their solo runs (all must be equal, none may fail), their p50/p95,
the bad input's answer time under the room's load, how many flood requests were refused, whether the secret
was read, the server's peak RSS during the wave and its RSS after it settles. Traffic stays on the loopback;
the attacker's address is a made-up ``X-Forwarded-For`` that uvicorn takes from a local proxy. Results go to
``bench/results/hostile.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from load import RESULTS, HttpStudent, prompt_for, rss_mib, start_server  # noqa: E402  (bench/load.py)

ATTACKER = "203.0.113.66"  # a documentation address (RFC 5737): never routed, only a header here
SECRET = "My bank PIN is 4711 and my password is hunter2-. Keep them safe."


def call(url: str, api_name: str, data: list, address: str | None = None, timeout: float = 300) -> tuple[str, str]:
    """POST ``/gradio_api/call/<api_name>`` and read its event stream: (final event, its data as text)."""
    headers = {"x-forwarded-for": address} if address else {}
    with httpx.Client(base_url=url, timeout=timeout, headers=headers) as http:
        posted = http.post(f"gradio_api/call/{api_name}", json={"data": data})
        posted.raise_for_status()
        event, lines = None, []
        with http.stream("GET", f"gradio_api/call/{api_name}/{posted.json()['event_id']}") as stream:
            for line in stream.iter_lines():
                if line.startswith("event:"):
                    event, lines = line[6:].strip(), []
                elif line.startswith("data:"):
                    lines.append(line[5:].strip())
                elif not line and event in ("complete", "error"):
                    break
    return event or "", "\n".join(lines)


def steps_of(url: str) -> dict:
    """From the page's config: the first (check) step of Generate's and Eviction's buttons, and the Blocks
    room view's refreshes, each as (fn_index, the inputs' opening values)."""
    config = httpx.get(f"{url}config", timeout=30).json()
    by_elem = {c.get("props", {}).get("elem_id"): c["id"] for c in config["components"]}
    values = {c["id"]: c.get("props", {}).get("value") for c in config["components"]}
    found: dict = {"checks": [], "room": []}
    for dep in config["dependencies"]:
        targets = [tuple(t) for t in dep.get("targets", [])]
        for elem in ("generate-btn", "evict-run"):
            if (by_elem.get(elem), "click") in targets and dep.get("trigger_after") is None:
                found["checks"].append((dep["id"], [values.get(i) for i in dep["inputs"]]))
        if by_elem.get("room-summary") in dep.get("outputs", []):
            found["room"].append((dep["id"], [None] * len(dep["inputs"])))
    return found


def join(url: str, fn_index: int, data: list, address: str, session: str | None = None) -> str:
    """One step by ``fn_index``, as a script sends it (no heartbeat); the messages it got, as text."""
    session = session or uuid.uuid4().hex[:11]
    headers = {"x-forwarded-for": address}
    body = {"data": data, "fn_index": fn_index, "session_hash": session, "event_data": None}
    httpx.post(f"{url}gradio_api/queue/join", json=body, headers=headers, timeout=60).raise_for_status()
    seen = []
    params = {"session_hash": session}
    with httpx.stream("GET", f"{url}gradio_api/queue/data", params=params, headers=headers, timeout=120) as s:
        for line in s.iter_lines():
            if line.startswith("data:"):
                seen.append(line[5:])
                if json.loads(line[5:]).get("msg") == "process_completed":
                    break
    return "\n".join(seen)


class Rss:
    """The server's RSS, sampled every 0.2 s in a thread while a wave runs (MiB)."""

    def __init__(self, pid: int):
        self.pid, self.peak, self._stop = pid, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_mib(self.pid) or 0.0)
            time.sleep(0.2)

    def __enter__(self) -> Rss:
        self._thread.start()
        return self

    def __exit__(self, *_) -> None:
        self._stop.set()
        self._thread.join()


def attack(url: str, steps: dict, flood: int, report: dict) -> None:
    """The attacker's five attacks, one after another, while the room runs."""
    report["tiny_temperature"] = [
        call(url, "generate", ["Hello!", 2, True, t, 1.0, 0], ATTACKER)[0] for t in ("1e-38", 5e-324)
    ]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda s: join(url, s[0], s[1], ATTACKER), steps["checks"] * 10))
    report["checks_sent"] = 10 * len(steps["checks"])
    seen = " ".join(join(url, i, d, ATTACKER) for i, d in steps["room"])
    report["secret_read"] = "4711" in seen or "hunter2" in seen
    with ThreadPoolExecutor(32) as pool:
        events = list(
            pool.map(lambda _: call(url, "generate", ["Hi", 64, True, 0.0, 1.0, 0], ATTACKER)[0], range(flood))
        )
    report["flood"] = {"sent": flood, "refused": events.count("error"), "answered": events.count("complete")}
    t0 = time.perf_counter()
    event, text = call(url, "generate", ["Hello", -5, True, 0.0, 1.0, 0], ATTACKER)
    report["bad_input"] = {"event": event, "answer_s": round(time.perf_counter() - t0, 3), "message": text[:160]}


def _history_attack(url: str, pid: int, messages: int) -> dict:
    """A list history of ``messages`` × 200,000 characters: its refusal time and the server's RSS around it."""
    big = "y" * 200_000
    history = [{"role": ("user", "assistant")[i % 2], "content": big} for i in range(messages)]
    body = json.dumps({"data": ["And then?", 8, True, 0.0, 1.0, 0, history, "model"]})
    before = rss_mib(pid) or 0.0
    with Rss(pid) as rss, httpx.Client(base_url=url, timeout=600, headers={"x-forwarded-for": ATTACKER}) as http:
        t0 = time.perf_counter()
        posted = http.post("gradio_api/call/chat", content=body, headers={"content-type": "application/json"})
        received = time.perf_counter()
        with http.stream("GET", f"gradio_api/call/chat/{posted.json()['event_id']}") as stream:
            text = "\n".join(stream.iter_lines())
        done = time.perf_counter()
    time.sleep(2)
    return {
        "megabytes": round(len(body) / 1e6, 1),
        "refused": "event: error" in text,
        "request_s": round(done - t0, 3),
        "after_received_s": round(done - received, 3),
        "rss_mib": [round(before), round(max(rss.peak, before)), round(rss_mib(pid) or 0)],
    }


def _mcp_sessions(url: str) -> list[str]:
    """Two MCP sessions each calling the generate tool at once (after a first call has made Gradio's bridge
    client): each call's outcome, "ok" or its error's first words."""
    import anyio
    from mcp import ClientSession
    from mcp.client.streamable_http import streamablehttp_client

    tools = {t["meta"]["endpoint_name"]: t["name"] for t in httpx.get(f"{url}gradio_api/mcp/schema", timeout=30).json()}
    out: dict[str, str] = {}

    async def call_tool(session_id: str | None, name: str, args: dict) -> str:
        headers = {"mcp-session-id": session_id} if session_id else None
        async with (
            streamablehttp_client(f"{url}gradio_api/mcp/", headers=headers) as (read, write, _),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            result = await session.call_tool(name, args)
        return result.content[0].text[:80] if result.isError else "ok"

    async def run() -> None:
        await call_tool(None, tools["memory"], {"config": "Llama-3-8B"})
        args = {"prompt_text": "Tell me a story about the sea.", "max_new_tokens": 32, "chat": True}

        async def one(sid: str) -> None:
            out[sid] = await call_tool(sid, tools["generate"], args)

        async with anyio.create_task_group() as tasks:
            for sid in ("one", "two"):
                tasks.start_soon(one, sid)

    anyio.run(run)
    return [out[k] for k in sorted(out)]


def _link_note_markup() -> list[str]:
    """The deep-link note's markup for hostile links, beyond its own lead-in (none may remain)."""
    from html.parser import HTMLParser

    from kvviz.ui.page.deeplinks import note_text, parse_link

    found: list[str] = []

    class Tags(HTMLParser):
        def handle_starttag(self, tag, attrs):
            if (tag, attrs) not in (("p", []), ("strong", [])):
                found.append(tag)

    for query in (
        {"tab": "[log in again](http://203.0.113.1/login)"},
        {"tab": "![a](http://203.0.113.1/px.png)"},
        {"tab": "<img src=http://203.0.113.1/px.png>"},
        {"<b style=color:red;font-size:99px>X</b>": "1"},
    ):
        Tags().feed(note_text(parse_link(query, {}, ["tab_memory"]).notes))
    return found


def _upload(url: str, megabytes: int) -> dict:
    """A ``megabytes`` MiB file streamed to /gradio_api/upload, 1 MiB at a time."""

    def body():
        yield b'--b\r\nContent-Disposition: form-data; name="files"; filename="config.json"\r\n\r\n'
        for _ in range(megabytes):
            yield b" " * 2**20
        yield b"\r\n--b--\r\n"

    t0 = time.perf_counter()
    try:
        headers = {"content-type": "multipart/form-data; boundary=b", "x-forwarded-for": ATTACKER}
        status = httpx.post(f"{url}gradio_api/upload", content=body(), headers=headers, timeout=600).status_code
    except httpx.TransportError as exc:  # the server closed the connection on a refused body
        status = type(exc).__name__
    return {"megabytes": megabytes, "status": status, "seconds": round(time.perf_counter() - t0, 2)}


def round_two(url: str, pid: int, steps: dict, history_messages: int, upload_mb: int, report: dict) -> None:
    """Issue 38's attacks, one after another (see the module's list, 6–11)."""
    report["list_history"] = _history_attack(url, pid, history_messages)
    report["mcp_sessions"] = _mcp_sessions(url)
    secret = "hunter2-zebra-9931 is my bank PIN."
    httpx.post(f"{url}gradio_api/run/generate", json={"data": [secret, 2, True, 0.0, 1.0, 0]}, timeout=300)
    seen = " ".join(join(url, i, d, ATTACKER, session="anonymous") for i, d in steps["room"])
    report["anonymous_read"] = "zebra-9931" in seen
    report["link_note_markup"] = _link_note_markup()
    report["upload"] = _upload(url, upload_mb)
    report["tiny_top_p"] = [
        call(url, "generate", ["Hello!", 2, True, 0.7, p, 0], ATTACKER)[0] for p in (1e-300, 5e-324)
    ]


def long_wave(url: str, pid: int, n: int, tokens: int, new_tokens: int) -> dict:
    """``n`` near-maximum prompts from ``n`` addresses at once: how many are admitted, how long each waits for
    its answer, the server's peak RSS, and its RSS once the wave is over (10 s after the last answer)."""
    body = "word " * tokens  # one token a word for SmolLM2's tokenizer, plus the chat template

    def one(i: int) -> tuple[float, str, str]:
        t0 = time.perf_counter()
        event, text = call(url, "generate", [f"{i} {body}", new_tokens, True, 0.0, 1.0, 0], f"192.0.2.{i + 1}", 900)
        return time.perf_counter() - t0, event, text

    with Rss(pid) as rss, ThreadPoolExecutor(n) as pool:
        results = list(pool.map(one, range(n)))
    time.sleep(10)
    answered = [r for r in results if r[1] == "complete"]
    return {
        "prompts": n,
        "prompt_words": tokens,
        "new_tokens": new_tokens,
        "answered": len(answered),
        "refused": [r[2][:120] for r in results if r[1] != "complete"],
        "answer_s": sorted(round(r[0], 1) for r in answered),
        "rss_peak_mib": round(rss.peak),
        "rss_after_mib": round(rss_mib(pid) or 0),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--students", type=int, default=24)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--flood", type=int, default=200, help="bare /call/generate requests from one address")
    ap.add_argument("--long", type=int, default=6, help="near-maximum prompts sent at once after the room (0: none)")
    ap.add_argument("--long-tokens", type=int, default=7600, help="words in each long prompt (a token each)")
    ap.add_argument("--long-new", type=int, default=512, help="new tokens each long prompt asks for")
    ap.add_argument("--long-only", action="store_true", help="the long wave alone, on a freshly started server")
    ap.add_argument("--history-messages", type=int, default=64, help="messages of 200,000 characters in the list")
    ap.add_argument("--upload-mb", type=int, default=200, help="MiB of the upload past the config limit")
    ap.add_argument("--smoke", action="store_true", help="2 students, 4 tokens, small attacks: the script works")
    ap.add_argument("--out", default="hostile.json", help="file name under bench/results/")
    args = ap.parse_args(argv)
    if args.smoke:
        args.students, args.new_tokens, args.flood, args.long = 2, 4, 4, 0
        args.history_messages, args.upload_mb = 4, 2
        args.out = "hostile_smoke.json" if args.out == "hostile.json" else args.out

    proc, url, tmp = start_server({"KVVIZ_PUBLIC": "1", "KVVIZ_MCP": "1"})
    try:
        if args.long_only:
            time.sleep(60)  # the start-up examples finish computing: idle is idle
            report = {"rss_idle_mib": round(rss_mib(proc.pid) or 0)}
            report["long_wave"] = long_wave(url, proc.pid, args.long, args.long_tokens, args.long_new)
            print(json.dumps(report, indent=2))
            (RESULTS / args.out).write_text(json.dumps(report, indent=2) + "\n")
            return 0
        prompts = [prompt_for(i) for i in range(args.students)]
        victim = HttpStudent(url)
        victim.predict(SECRET, 2, True, 0.0, 1.0, 0, api_name="/generate")  # another student's private prompt
        # the reference answers come from the library in this process, one run at a time (the server keeps a
        # finished run for a late duplicate, so asking it first would answer the room from its memory)
        from kvviz.capture.loop import capture
        from kvviz.models import load_model

        lm = load_model()
        solo = {p: capture(lm, p, chat=True, max_new_tokens=args.new_tokens).text for p in prompts}
        del lm
        gc.collect()
        steps = steps_of(url)
        idle = rss_mib(proc.pid)
        report: dict = {"students": args.students, "new_tokens": args.new_tokens, "rss_idle_mib": round(idle or 0)}
        barrier = threading.Barrier(args.students + 1)

        def student(i: int) -> tuple[float, str | None, str | None]:
            s = HttpStudent(url)
            s.http.headers["x-forwarded-for"] = f"198.51.100.{i + 1}"  # each student's own machine (RFC 5737)
            barrier.wait()
            t0 = time.perf_counter()
            try:
                out = s.predict(prompts[i], args.new_tokens, True, 0.0, 1.0, 0, api_name="/generate")
                return time.perf_counter() - t0, out["text"], None
            except Exception as exc:  # every failure is counted, none hidden
                return time.perf_counter() - t0, None, f"{type(exc).__name__}: {exc}"[:200]

        with Rss(proc.pid) as rss, ThreadPoolExecutor(args.students) as pool:
            futures = [pool.submit(student, i) for i in range(args.students)]
            barrier.wait()

            def attacker_run() -> None:
                attack(url, steps, args.flood, report)
                round_two(url, proc.pid, steps, args.history_messages, args.upload_mb, report)

            attacker = threading.Thread(target=attacker_run)
            attacker.start()
            results = [f.result() for f in futures]
            attacker.join()
        time.sleep(10)  # the wave's memory settles (finished runs kept for late duplicates, the allocator)
        lat = sorted(r[0] for r in results)
        report.update(
            {
                "answers_equal_solo": sum(r[1] == solo[p] for r, p in zip(results, prompts)),
                "student_errors": [r[2] for r in results if r[2]],
                "p50_s": round(statistics.median(lat), 2),
                "p95_s": round(lat[min(len(lat) - 1, int(round(0.95 * (len(lat) - 1))))], 2),
                "rss_peak_mib": round(rss.peak),
                "rss_after_mib": round(rss_mib(proc.pid) or 0),
                "server_alive": proc.poll() is None,
            }
        )
        if args.long:
            report["long_wave"] = long_wave(url, proc.pid, args.long, args.long_tokens, args.long_new)
        print(json.dumps(report, indent=2))
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / args.out).write_text(json.dumps(report, indent=2) + "\n")
        ok = (
            report["answers_equal_solo"] == args.students
            and not report["student_errors"]
            and not report["secret_read"]
            and not report["anonymous_read"]
            and report["list_history"]["refused"]
            and report["mcp_sessions"] == ["ok", "ok"]
            and not report["link_note_markup"]
            and report["upload"]["status"] != 200
            and report["tiny_top_p"] == ["complete", "complete"]
        )
        return 0 if ok else 1
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    raise SystemExit(main())
