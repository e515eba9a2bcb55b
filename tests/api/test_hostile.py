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
import uuid

import httpx
import pytest

from kvviz.capture.loop import capture
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


def _room_refreshes(url: str) -> list[int]:
    config = httpx.get(f"{url}config", timeout=30).json()
    ids = {c["id"] for c in config["components"] if c.get("props", {}).get("elem_id") == "room-summary"}
    found = [d["id"] for d in config["dependencies"] if ids & set(d["outputs"])]
    assert found, "no event refreshes the room's prefix cache"
    return found


def _read_room(url: str, fn_index: int, session: str) -> str:
    reply = httpx.post(
        f"{url}gradio_api/run/predict",
        json={"fn_index": fn_index, "data": [None], "session_hash": session},
        headers={"x-forwarded-for": "203.0.113.66"},
        timeout=60,
    )
    reply.raise_for_status()
    return json.dumps(reply.json(), ensure_ascii=False)


def test_another_sessions_prompt_is_not_readable_from_the_blocks_view(public_app):
    url, victim = public_app.url, f"victim-{uuid.uuid4().hex[:8]}"
    event, out = call(url, "generate", [SECRET, 2, True, 0.0, 1.0, 0], "198.51.100.77", session=victim)
    assert event == "complete", out
    refreshes = _room_refreshes(url)
    for fn_index in refreshes:  # the timer's tick and the tab's opening, each with a session of its own
        seen = _read_room(url, fn_index, f"attacker-{uuid.uuid4().hex[:8]}")
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
