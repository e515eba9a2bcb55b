"""A public Space under load: bad input is answered at once even with a full line, one job per client,
a time budget, a memory ceiling, and config bombs that cost nothing."""

from __future__ import annotations

import json
import time

import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

BOMB = {
    "model_type": "llama",
    "num_hidden_layers": 1_000_000_000,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 4096,
}


def _error_of(job) -> str | None:
    try:
        job.result()
        return None
    except AppError as exc:
        return str(exc)


def _timed(fn) -> tuple[float, str | None]:
    start = time.perf_counter()
    try:
        fn()
        message = None
    except AppError as exc:
        message = str(exc)
    return time.perf_counter() - start, message


def test_full_line_bad_input_is_answered_at_once_and_one_client_gets_one_job(inprocess_app):
    url, gate = inprocess_app.url, inprocess_app.ctx.jobs.gate
    holder = gate.admit("a job already running")  # holds the one slot, as a long generation would
    queued = []
    try:
        clients = [Client(url, verbose=False) for _ in range(23)]
        queued = [
            c.submit(f"Question {i}: the capital of France is", 1, False, 0.0, 1.0, 0, api_name="/generate")
            for i, c in enumerate(clients)
        ]
        deadline = time.monotonic() + 60
        while gate.snapshot()["waiting"] < 23 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert gate.snapshot() == {"running": 1, "waiting": 23, "sessions": 24}

        probe = Client(url, verbose=False)
        bad = {
            "/generate": lambda: probe.predict("hello", -5, False, 0.0, 1.0, 0, api_name="/generate"),
            "/evict": lambda: probe.predict("hello", "no-such-policy", 16, api_name="/evict"),
            "/memory": lambda: probe.predict(json.dumps(BOMB), api_name="/memory"),
        }
        for endpoint, call in bad.items():
            seconds, message = _timed(call)
            assert message, f"{endpoint} accepted bad input"
            assert seconds <= 1.0, f"{endpoint} took {seconds:.2f} s to refuse bad input with 24 jobs in line"

        greedy = Client(url, verbose=False)  # one script firing ten jobs: the first waits, nine are refused
        jobs = [greedy.submit(f"Job {i}", 1, False, 0.0, 1.0, 0, api_name="/generate") for i in range(10)]
        deadline = time.monotonic() + 30
        while sum(j.done() for j in jobs) < 9 and time.monotonic() < deadline:
            time.sleep(0.1)
        refused = [j for j in jobs if j.done()]
        waiting = [j for j in jobs if not j.done()]
        assert len(refused) == 9 and len(waiting) == 1  # whichever arrived first holds the client's one place
        errors = [_error_of(j) for j in refused]
        assert all(e and "still queued, position 24 of 24" in e for e in errors), errors[:2]
        queued += waiting
    finally:
        holder.release()
    results = [job.result(timeout=300) for job in queued]
    assert all(r["generated_tokens"] == 1 for r in results)
    assert gate.snapshot() == {"running": 0, "waiting": 0, "sessions": 0}


def test_a_job_past_its_time_budget_ends_with_what_it_has(inprocess_app):
    gate = inprocess_app.ctx.jobs.gate
    old, gate.max_seconds = gate.max_seconds, 1.0
    try:
        out = Client(inprocess_app.url, verbose=False).predict(
            "Once upon a time", 256, False, 0.0, 1.0, 0, api_name="/generate"
        )
    finally:
        gate.max_seconds = old
    assert 1 <= out["generated_tokens"] < 256 and out["stop_reason"] == "stopped"
    assert "time budget of 1 s" in out["note"]


def test_memory_ceiling_refuses_model_jobs_with_a_message(inprocess_app):
    gate = inprocess_app.ctx.jobs.gate
    old, gate.max_rss_bytes = gate.max_rss_bytes, 2**20
    try:
        with pytest.raises(AppError, match="short of memory"):
            Client(inprocess_app.url, verbose=False).predict("Hi", 1, False, 0.0, 1.0, 0, api_name="/generate")
    finally:
        gate.max_rss_bytes = old


@pytest.mark.parametrize(
    "field, value",
    [
        ("num_hidden_layers", 1_000_000_000),
        ("num_attention_heads", 10**12),
        ("num_key_value_heads", -8),
        ("hidden_size", 4096.5),
        ("head_dim", 10**15),
        ("max_position_embeddings", 10**18),
        ("sliding_window", -1),
        ("layer_types", ["full_attention"] * 10_000),
    ],
)
def test_config_bombs_cost_nothing_and_the_server_lives(client, app_server_process, field, value):
    cfg = {**BOMB, "num_hidden_layers": 32, field: value}
    before, log_start = app_server_process.rss(), len(app_server_process.log())
    start = time.perf_counter()
    with pytest.raises(AppError) as err:
        client.predict(json.dumps(cfg), 8192, api_name="/memory")
    assert time.perf_counter() - start < 2.0
    assert field in str(err.value) or "one entry per layer" in str(err.value)
    assert app_server_process.alive()
    assert app_server_process.rss() - before < 256 * 2**20
    logged = app_server_process.log()[log_start:]
    assert "Traceback" not in logged and "refused: " in logged  # a user error is one log line
