"""A public server probed the way a hostile visitor probes it: raw ``/gradio_api/call/...`` requests and
``/gradio_api/run/predict`` with an ``fn_index``, from addresses of the attacker's choosing.

One public-mode server (``KVVIZ_PUBLIC=1``) for the module. Its clients sit on the loopback, where uvicorn
takes the caller's address from ``X-Forwarded-For`` (a local proxy's), so each simulated visitor sends
its own address there.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid

import httpx
import pytest

from kvviz.capture.loop import capture
from kvviz.ui.blocks.tab import SECTIONS
from tests.server import start_app, stop_app

PER_ADDRESS = 3
SECRET = "My bank PIN is 4711 and my password is hunter2-. Keep them safe for me, please."
VICTIMS = ["Name three colours.", "What is the capital of France?", "Write one word about the sea."]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture(scope="module")
def public_app(tmp_path_factory):
    base = tmp_path_factory.mktemp("public-app")
    stale = base / "tmp" / f"kvviz-{_dead_pid()}-killed"  # exports of a server killed with kill -9
    (stale / "session").mkdir(parents=True)
    (stale / "session" / "kvviz-trace.npz").write_bytes(b"a killed server's export")
    # a slow model on paper (1e5 key reads a second): a 600-token prompt is a long job, a question a short one
    env = {"KVVIZ_PUBLIC": "1", "KVVIZ_JOBS_PER_ADDRESS": str(PER_ADDRESS), "KVVIZ_KEY_READS_PER_S": "1e5"}
    running = start_app(base, env)
    running.stale = stale
    yield running
    stop_app(running.proc)


def call(url: str, api_name: str, data: list, address: str, session: str | None = None) -> tuple[str, object]:
    """POST ``/gradio_api/call/<api_name>``, then read its event stream: (final event, its data)."""
    headers = {"x-forwarded-for": address}
    body = {"data": data} if session is None else {"data": data, "session_hash": session}
    with httpx.Client(base_url=url, timeout=300, headers=headers) as http:
        posted = http.post(f"gradio_api/call/{api_name}", json=body)
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
    text = "\n".join(lines)
    try:
        return event, json.loads(text)
    except ValueError:
        return event, text


def together(calls: list) -> list:
    """Run every ``call(...)`` argument tuple at once; their results in order."""
    out: list = [None] * len(calls)

    def one(i):
        out[i] = call(*calls[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    return out


def test_a_temperature_too_small_to_divide_by_breaks_no_ones_generation(public_app, lm):
    url = public_app.url
    victims = [(url, "generate", [p, 24, True, 0.0, 1.0, 0], f"198.51.100.{i}") for i, p in enumerate(VICTIMS)]
    attacks = [
        (url, "generate", ["Hello!", 2, True, t, 1.0, 0], f"203.0.113.{i}") for i, t in enumerate(["1e-38", 5e-324])
    ]
    results = together([*victims, *attacks])
    for (event, out), prompt in zip(results, VICTIMS):
        assert event == "complete", out
        assert out[0]["text"] == capture(lm, prompt, chat=True, max_new_tokens=24).text
    for event, out in results[len(VICTIMS) :]:  # the attacker's own run is simply greedy
        assert event == "complete", out
        assert out[0]["text"] == capture(lm, "Hello!", chat=True, max_new_tokens=2).text


def test_a_minus_zero_is_refused(public_app):
    event, out = call(public_app.url, "generate", ["Hello!", 2, True, "-0", 1.0, 0], "203.0.113.20")
    assert event == "error" and "minus sign" in str(out)


def _room_refreshes(url: str) -> list[tuple[int, int | None, bool]]:
    """Every event that draws the room's prefix cache: (its index, the event that must come first in the session:
    the Blocks tab's opening draws the room only once the room's sub-tab was picked, a state of the session; and
    whether it is the top bar's pick, which draws it only for the Blocks tab)."""
    config = httpx.get(f"{url}config", timeout=30).json()
    by_elem = {c.get("props", {}).get("elem_id"): c["id"] for c in config["components"]}
    bar = by_elem["blocks-sections"]
    (pick,) = [d["id"] for d in config["dependencies"] if [bar, "select"] in [list(t) for t in d["targets"]]]
    top = [c["id"] for c in config["components"] if c.get("type") == "tabs" and c["id"] != bar]
    found = [
        (
            d["id"],
            pick if len(d["inputs"]) > 1 else None,
            any(list(t) in ([i, "select"] for i in top) for t in d["targets"]),
        )
        for d in config["dependencies"]
        if by_elem["room-summary"] in d["outputs"]
    ]
    assert found, "no event refreshes the room's prefix cache"
    return found


def _read_room(url: str, event: tuple[int, int | None, bool], session: str) -> str:
    fn_index, first, on_top_bar = event
    if first is not None:  # the room's sub-tab picked in this session, as a click on it does
        picked = {"index": 2, "value": SECTIONS[2], "selected": True}
        _post(url, {"fn_index": first, "data": [], "event_data": picked, "session_hash": session})
    body = {"fn_index": fn_index, "data": [None, None], "session_hash": session}
    if on_top_bar:  # the top bar's pick: the Blocks tab, as a click on it does
        body["event_data"] = {"index": 0, "value": "Blocks", "selected": True}
    return json.dumps(_post(url, body), ensure_ascii=False)


def _post(url: str, body: dict) -> dict:
    reply = httpx.post(
        f"{url}gradio_api/run/predict",
        json=body,
        headers={"x-forwarded-for": "203.0.113.66"},
        timeout=60,
    )
    reply.raise_for_status()
    return reply.json()


def test_another_sessions_prompt_is_not_readable_from_the_blocks_view(public_app):
    url, victim = public_app.url, f"victim-{uuid.uuid4().hex[:8]}"
    event, out = call(url, "generate", [SECRET, 2, True, 0.0, 1.0, 0], "198.51.100.77", session=victim)
    assert event == "complete", out
    refreshes = _room_refreshes(url)
    for event in refreshes:  # the timer's tick and the tab's opening, each with a session of its own
        seen = _read_room(url, event, f"attacker-{uuid.uuid4().hex[:8]}")
        assert "hunter2" not in seen and "PIN is 471" not in seen, "another session's prompt is readable"
        assert "You are a helpful" in seen  # the system prompt every request shares stays readable
    assert "hunter2" in _read_room(url, refreshes[0], victim), "a session reads its own prompt's blocks"


def test_one_address_cannot_fill_the_queue_with_a_session_per_request(public_app):
    url = public_app.url
    script = [
        (url, "generate", [f"Request {i}: tell me a story.", 32, True, 0.0, 1.0, 0], "203.0.113.99") for i in range(8)
    ]
    student = (url, "generate", ["Name a large animal.", 4, True, 0.0, 1.0, 0], "198.51.100.200")
    *scripted, studied = together([*script, student])
    refused = [out for event, out in scripted if event == "error"]
    assert len(refused) >= len(script) - PER_ADDRESS
    assert all("network address" in str(out) and "KVVIZ_JOBS_PER_ADDRESS" in str(out) for out in refused), refused
    assert studied[0] == "complete", studied


def test_a_killed_servers_exports_are_removed_at_start_up(public_app):
    assert not public_app.stale.exists()
    assert "removed a dead server's temp folder" in public_app.log()


def test_long_prompts_are_admitted_by_the_model_time_already_outstanding(public_app):
    url, long_prompt = public_app.url, "word " * 900  # ~930 tokens: ~260 s of model time at the fixture's pace
    longs = [(url, "generate", [f"{i} {long_prompt}", 4, True, 0.0, 1.0, 0], f"192.0.2.{i}") for i in range(4)]
    results = together(longs)
    refused = [out for event, out in results if event == "error"]
    assert len(refused) >= 2, "every long prompt was admitted, to share the model past its time budget"
    assert all("busy with long jobs" in str(out) for out in refused), refused
    assert any(event == "complete" for event, _ in results)
    short = call(url, "generate", ["Name a large animal.", 4, True, 0.0, 1.0, 0], "198.51.100.201")
    assert short[0] == "complete", short


def _peak_rss(app, during) -> tuple[int, int, object]:
    """(RSS before, the highest RSS seen while ``during()`` runs, what it returned), sampled every 10 ms."""
    before, peak, done = app.rss(), [app.rss()], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], app.rss())
            done.wait(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        result = during()
    finally:
        done.set()
        sampler.join()
    return before, max(peak[0], app.rss()), result


@pytest.mark.parametrize("shape", ["list", "object"])
def test_a_chat_history_sent_as_json_is_size_checked_before_it_is_tokenized(public_app, shape):
    """64 messages of 200,000 characters (12.8 MB) sent as a list — or one message's worth as an object —
    are refused by the history's size before any tokenizing: quickly, with no memory to speak of."""
    big = "y" * 200_000
    history = [{"role": ("user", "assistant")[i % 2], "content": big} for i in range(64)]
    if shape == "object":
        history = {"role": "user", "content": big * 8}
    body = json.dumps({"data": ["And then?", 8, True, 0.0, 1.0, 0, history, "model"]})
    call(public_app.url, "chat", ["Hi", 2, True, 0.0, 1.0, 0, "[]", "model"], "198.51.100.90")  # warm

    def refused() -> tuple[float, float, str]:
        with httpx.Client(base_url=public_app.url, timeout=300, headers={"x-forwarded-for": "203.0.113.91"}) as http:
            t0 = time.perf_counter()
            posted = http.post("gradio_api/call/chat", content=body, headers={"content-type": "application/json"})
            t1 = time.perf_counter()
            with http.stream("GET", f"gradio_api/call/chat/{posted.json()['event_id']}") as stream:
                text = "\n".join(stream.iter_lines())
            return t1 - t0, time.perf_counter() - t1, text

    before, peak, (received, answered, text) = _peak_rss(public_app, refused)
    assert "event: error" in text and "characters of JSON" in text, text[-300:]
    # the server's own part, once the 12.8 MB body is in: the transfer and Gradio's parse come before any of ours
    assert answered <= 0.5, f"refused {answered:.2f} s after the request was received"
    assert received + answered <= 2.0, f"the whole request took {received + answered:.2f} s"
    assert peak - before <= 50 * 2**20, f"RSS grew {(peak - before) / 2**20:.0f} MiB while refusing it"


def test_a_request_without_a_session_is_its_own_nobody_reads_it_by_naming_anonymous(public_app):
    url, secret = public_app.url, "hunter2-zebra-9931 is my bank PIN, remember it."
    reply = httpx.post(
        f"{url}gradio_api/run/generate",
        json={"data": [secret, 2, True, 0.0, 1.0, 0]},
        headers={"x-forwarded-for": "198.51.100.78"},
        timeout=300,
    )
    assert reply.status_code == 200 and "data" in reply.json(), reply.text[:300]
    for event in _room_refreshes(url):
        for named in ("anonymous", "default", "in-process", "anon:"):
            seen = _read_room(url, event, named)
            assert "zebra-9931" not in seen and "bank PIN" not in seen, f"session {named!r} reads the prompt"


@pytest.mark.parametrize("top_p", [1e-300, 5e-324, "1e-300"])
def test_a_top_p_below_float32_s_smallest_runs_greedy(public_app, lm, top_p):
    event, out = call(public_app.url, "generate", ["Hello!", 4, True, 0.7, top_p, 3], f"203.0.113.{len(str(top_p))}")
    assert event == "complete", out
    assert out[0]["text"] == capture(lm, "Hello!", chat=True, max_new_tokens=4).text
    assert "invalid multinomial" not in public_app.log()


def _streamed_upload(size: int, boundary: str = "kvvizboundary"):
    """A multipart body of one ``size``-byte file, made 1 MiB at a time (never held whole)."""
    yield (
        f'--{boundary}\r\nContent-Disposition: form-data; name="files"; filename="config.json"\r\n'
        "Content-Type: application/json\r\n\r\n"
    ).encode()
    chunk = b" " * 2**20
    for _ in range(size // len(chunk)):
        yield chunk
    yield f"\r\n--{boundary}--\r\n".encode()


def test_an_upload_past_the_largest_config_is_refused(public_app):
    size = 200 * 2**20
    headers = {"content-type": "multipart/form-data; boundary=kvvizboundary", "x-forwarded-for": "203.0.113.92"}
    try:
        reply = httpx.post(
            f"{public_app.url}gradio_api/upload", content=_streamed_upload(size), headers=headers, timeout=120
        )
        status, text = reply.status_code, reply.text
    except httpx.TransportError as exc:  # the server may close the connection once it refused the body
        status, text = 413, str(exc)
    assert status == 413, (status, text[:300])
    kept = [p for p in public_app.temp_dir.rglob("*") if p.is_file() and p.stat().st_size > 1 << 20]
    assert not kept, f"the server kept {kept}"
    small = httpx.post(
        f"{public_app.url}gradio_api/upload",
        files={"files": ("config.json", b'{"model_type": "llama"}', "application/json")},
        headers={"x-forwarded-for": "203.0.113.92"},
        timeout=60,
    )
    assert small.status_code == 200, small.text[:300]  # a config.json's size still goes through
