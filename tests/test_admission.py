"""kvviz.admission: one job per session, arrival order, a bounded line, a memory ceiling and a time budget."""

from __future__ import annotations

import threading
import time

import pytest

from kvviz.admission import REAP_AFTER, WAIT_POLL_S, Gate, Refused
from tests.test_process_memory import no_release_pending


def test_second_job_of_a_session_is_refused_with_its_place_in_line():
    gate = Gate(slots=1)
    running = gate.admit("a")
    queued = gate.admit("b")
    with pytest.raises(Refused, match="still running"):
        gate.admit("a")
    with pytest.raises(Refused, match="still queued, position 1 of 1"):
        gate.admit("b")
    running.release()
    assert queued.position() == 0
    gate.admit("a").release()  # a's job ended: a may submit again


def test_jobs_start_in_arrival_order_and_never_more_than_the_slots():
    gate = Gate(slots=2)
    peak = [0]

    def job(ticket):
        ticket.wait()
        peak[0] = max(peak[0], gate.snapshot()["running"])
        time.sleep(0.05)
        ticket.release()

    tickets = [gate.admit(f"s{i}") for i in range(8)]
    threads = [threading.Thread(target=job, args=(t,)) for t in tickets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert peak[0] == 2
    started = sorted(tickets, key=lambda t: t.started)
    assert [t.number for t in started] == sorted(t.number for t in tickets)  # the gate starts them first come
    assert gate.snapshot() == {"running": 0, "waiting": 0, "sessions": 0}


def test_the_line_is_bounded():
    gate = Gate(slots=1, max_waiting=2)
    gate.admit("run")
    gate.admit("w1")
    gate.admit("w2")
    with pytest.raises(Refused, match="2 jobs are waiting"):
        gate.admit("w3")


def test_memory_ceiling_refuses_new_jobs_and_reports_what_is_spare():
    rss = [10 * 2**30]
    gate = Gate(max_rss_bytes=8 * 2**30, rss=lambda: rss[0])
    with pytest.raises(Refused, match=r"short of memory \(10.0 GiB in use, ceiling 8.0 GiB"):
        gate.admit("a")
    rss[0] = 6 * 2**30
    assert gate.spare_bytes() == 2 * 2**30
    gate.admit("a")


def test_time_budget_starts_when_the_job_runs_not_while_it_waits():
    gate = Gate(slots=1, max_seconds=0.2)
    first, second = gate.admit("a"), gate.admit("b")
    time.sleep(0.3)
    assert first.expired() and first.timed_out
    assert not second.expired()  # still waiting: its budget has not started
    first.release()
    assert second.wait(1.0) and not second.expired()
    assert second.wait(0) is True


def test_a_waiting_ticket_released_leaves_the_line_and_wait_times_out():
    gate = Gate(slots=1)
    gate.admit("a")
    waiting = gate.admit("b")
    assert waiting.wait(0.05) is False
    waiting.release()
    assert gate.snapshot()["waiting"] == 0
    with pytest.raises(Refused, match="cancelled"):
        waiting.wait(0.01)


def test_a_job_that_outlives_its_budget_loses_its_slot_to_the_line():
    """A job that never ends (it ignored ``expired``, or its caller vanished) does not hold the line for ever."""
    gate = Gate(slots=1, max_seconds=0.2)
    stuck = gate.admit("stuck")
    waiting = gate.admit("next")
    assert waiting.wait(0.1) is False  # within its budget the stuck job keeps the slot
    assert waiting.wait(REAP_AFTER * 0.2 + 2 * WAIT_POLL_S)  # past it, the waiting job gets the slot
    assert stuck.timed_out and stuck.released and gate.snapshot() == {"running": 1, "waiting": 0, "sessions": 1}
    stuck.release()  # the stuck job's own release, when it comes, changes nothing
    assert gate.snapshot()["running"] == 1 and waiting.position() == 0


def test_one_address_holds_at_most_per_address_jobs_whatever_its_sessions():
    gate = Gate(slots=2, max_waiting=100, per_address=3)
    script = [gate.admit(f"session {i}", address="10.0.0.9") for i in range(3)]  # a new session per request
    with pytest.raises(Refused, match=r"network address already has 3 model jobs.*KVVIZ_JOBS_PER_ADDRESS = 3"):
        gate.admit("session 3", address="10.0.0.9")
    students = [gate.admit(f"student {i}", address=f"10.0.1.{i}") for i in range(5)]  # others still get in
    assert gate.snapshot()["sessions"] == 8
    script[0].release()
    gate.admit("session 4", address="10.0.0.9")  # a place freed: the address may send one more
    with pytest.raises(Refused, match="network address"):  # jobs held in another gate count too
        gate.admit("session 5", address="10.0.1.0", elsewhere=2)
    assert all(t.position() >= 0 for t in students)


def test_without_a_bound_or_an_address_nothing_changes():
    gate = Gate(slots=1, max_waiting=100)
    [gate.admit(f"s{i}", address="10.0.0.9") for i in range(20)]
    bounded = Gate(slots=1, max_waiting=100, per_address=1)
    [bounded.admit(f"s{i}") for i in range(5)]  # no address known: only the session rule applies


def test_jobs_are_admitted_by_the_model_time_already_outstanding():
    gate = Gate(slots=8, max_waiting=100, max_outstanding_s=100.0)
    alone = gate.admit("long 1", cost_s=500.0)  # a job alone is always admitted (its size is bounded before)
    with pytest.raises(Refused, match=r"busy with long jobs.*about 500 s.*about 80 s more.*100 s"):
        gate.admit("long 2", cost_s=80.0)
    alone.release()
    first = gate.admit("long 3", cost_s=80.0)
    shorts = [gate.admit(f"short {i}", cost_s=1.0) for i in range(20)]  # a room of short runs fits beside it
    with pytest.raises(Refused, match="busy with long jobs"):
        gate.admit("long 4", cost_s=80.0)
    with pytest.raises(Refused, match="busy with long jobs"):  # what another gate holds counts too
        Gate(max_outstanding_s=100.0).admit("x", cost_s=30.0, elsewhere_s=80.0)
    assert first.position() == 0 and len(shorts) == 20


def test_closing_the_gate_ends_running_budgets_cancels_the_line_and_admits_no_one():
    gate = Gate(slots=1, max_waiting=4, max_seconds=600)
    running, waiting = gate.admit("a"), gate.admit("b")
    assert running.wait(0) and not running.expired()
    gate.close()
    assert running.expired() and running.timed_out  # a job polling its budget stops at its next step
    with pytest.raises(Refused, match="cancelled"):
        waiting.wait(0)
    with pytest.raises(Refused):
        gate.admit("c")
    running.release()
    assert gate.snapshot() == {"running": 0, "waiting": 0, "sessions": 0}


def test_the_last_job_out_hands_freed_memory_back_and_no_other_does(monkeypatch):
    from kvviz import process_memory

    no_release_pending()
    calls: list[tuple[dict, str]] = []
    gate = Gate(slots=2)
    monkeypatch.setattr(process_memory, "IDLE_RELEASE_S", 0.05)
    monkeypatch.setattr(
        process_memory, "release_memory", lambda: calls.append((gate.snapshot(), threading.current_thread().name))
    )
    first, second, third = gate.admit("a"), gate.admit("b"), gate.admit("c")  # c waits for a slot
    first.release()
    second.release()
    time.sleep(0.2)
    assert calls == [], "memory was trimmed while a job was still queued or running"
    third.wait(1)
    third.release()
    # not in the thread of the job that ended (a request handler about to send its answer): later, in its own
    assert calls == [], "memory was trimmed on the way out of the last job"
    deadline = time.monotonic() + 5
    while not calls and time.monotonic() < deadline:
        time.sleep(0.01)
    assert calls == [({"running": 0, "waiting": 0, "sessions": 0}, "kvviz-release")]
