"""A button's check step takes nothing at the gate: a client that sends only checks, the way a script sends
them (raw ``/gradio_api/queue/join`` with the step's ``fn_index``, never opening a heartbeat), holds no place,
and every endpoint behind it still answers (kvviz/ui/serving/model_job.py)."""

from __future__ import annotations

import json
import uuid
from types import SimpleNamespace

import httpx
from gradio_client import Client

from kvviz.ui.serving.identity import session_of


def _check_step(demo, button):
    """(fn_index, inputs) of the first step a click on ``button`` starts: its check."""
    for index, fn in demo.fns.items():
        if (button._id, "click") in [tuple(t) for t in fn.targets] and fn.trigger_after is None:
            return index, fn.inputs
    raise AssertionError("no click step on the button")


def _send_check(url: str, demo, button) -> str:
    """One check step, as a script sends it: joined by ``fn_index`` with the widgets' opening values; waits
    (reading the event stream, no heartbeat) until the server has finished it. Returns the session used."""
    index, inputs = _check_step(demo, button)
    session = uuid.uuid4().hex[:11]
    body = {
        "data": [c.value for c in inputs],
        "fn_index": index,
        "session_hash": session,
        "event_data": None,
        "trigger_id": button._id,
    }
    r = httpx.post(url + "gradio_api/queue/join", json=body, timeout=30)
    r.raise_for_status()
    with httpx.stream("GET", url + "gradio_api/queue/data", params={"session_hash": session}, timeout=60) as s:
        for line in s.iter_lines():
            if line.startswith("data:") and json.loads(line[5:]).get("msg") == "process_completed":
                break
    return session


def test_a_check_alone_does_not_hold_the_single_model_slot(inprocess_app):
    ctx, demo, url = inprocess_app.ctx, inprocess_app.demo, inprocess_app.url
    assert ctx.jobs.gate.slots == 1
    _send_check(url, demo, ctx.components["eviction.run"])
    job = Client(url, verbose=False).submit("Hi", "streaming_llm", 12, None, True, 2, {"sinks": 2}, api_name="/evict")
    out = job.result(timeout=30)  # with the slot held by the check, this waited for ever
    assert out["n_kept"] == 12
    assert ctx.jobs.gate.snapshot() == {"running": 0, "waiting": 0, "sessions": 0}


def test_checks_alone_do_not_fill_the_room(inprocess_app):
    ctx, demo, url = inprocess_app.ctx, inprocess_app.demo, inprocess_app.url
    room = ctx.jobs.room
    old = room.slots, room.max_waiting
    room.slots, room.max_waiting = 1, 2  # a small room, so a few checks would fill it and its line
    try:
        for _ in range(4):
            _send_check(url, demo, ctx.components["generate.button"])
        # with each check holding a place, this was "The server is busy: 2 jobs are waiting"
        out = Client(url, verbose=False).predict("Hello", 2, False, 0.0, 1.0, 0, api_name="/generate")
    finally:
        room.slots, room.max_waiting = old
    assert out["generated_tokens"] == 2
    assert room.snapshot() == {"running": 0, "waiting": 0, "sessions": 0}


def test_a_refusal_still_comes_from_the_check(inprocess_app):
    """The check still answers at once when the run would be refused: here, a second job of one session."""
    ctx, demo, url = inprocess_app.ctx, inprocess_app.demo, inprocess_app.url
    index, inputs = _check_step(demo, ctx.components["eviction.run"])
    session = uuid.uuid4().hex[:11]
    holder = ctx.jobs.gate.admit(session_of(SimpleNamespace(session_hash=session)), "a job already running")
    try:
        body = {"data": [c.value for c in inputs], "fn_index": index, "session_hash": session, "event_data": None}
        httpx.post(url + "gradio_api/queue/join", json=body, timeout=30).raise_for_status()
        with httpx.stream("GET", url + "gradio_api/queue/data", params={"session_hash": session}, timeout=60) as s:
            done = next(
                m
                for line in s.iter_lines()
                if line.startswith("data:")
                for m in [json.loads(line[5:])]
                if m.get("msg") == "process_completed"
            )
    finally:
        holder.release()
    assert not done["success"] and "still running" in json.dumps(done["output"])
