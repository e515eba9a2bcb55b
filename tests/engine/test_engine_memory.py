"""The engine's memory after a wave: finished runs kept by bytes as well as count, freed heap handed back idle."""

from __future__ import annotations

import time

import pytest

from kvviz import process_memory
from kvviz.engine import engine as engine_module
from kvviz.engine import handle as handle_module
from kvviz.engine.engine import Engine
from kvviz.engine.handle import wait_all
from tests.test_process_memory import no_release_pending

pytestmark = pytest.mark.slow


def test_a_finished_run_is_kept_for_late_duplicates_only_while_the_kept_traces_fit_their_bytes(lm, monkeypatch):
    engine = Engine(lm)
    short = engine.submit("Say hello.", chat=True, max_new_tokens=3)
    assert wait_all([short], 600)
    kept = short.trace.nbytes()
    assert engine.submit("Say hello.", chat=True, max_new_tokens=3).run is short.run  # kept: a late duplicate shares
    # a bound below one more such trace: the next finished run pushes the oldest out, whatever the count allows
    monkeypatch.setattr(handle_module, "FINISHED_RUNS_BYTES", kept + kept // 2)
    other = engine.submit("Say goodbye.", chat=True, max_new_tokens=3)
    assert wait_all([other], 600)
    late = engine.submit("Say hello.", chat=True, max_new_tokens=3)
    assert late.run is not short.run, "a finished run stayed kept past the bytes the kept traces may hold"
    assert wait_all([late], 600)


def test_the_engine_hands_freed_memory_back_once_idle_and_not_between_a_room_s_steps(lm, monkeypatch):
    no_release_pending()  # an earlier test's engine may have one due: it would be counted as this one's
    engine = Engine(lm)
    busy_at_release: list[bool] = []
    # this engine's releases only: another test's engine still alive in the process may go idle meanwhile (the
    # patched function is every engine's), and a release it fires says nothing of this engine's batch
    real = process_memory.release_when_idle

    def mine(idle, after_s=None) -> None:
        if getattr(idle, "__self__", None) is engine:
            real(idle, 0.05, release=lambda: busy_at_release.append(not engine._idle()))

    monkeypatch.setattr(engine_module, "release_when_idle", mine)
    handles = [engine.submit(f"Name {n} colours.", chat=True, max_new_tokens=4) for n in ("two", "three", "four")]
    assert wait_all(handles, 600)
    deadline = time.monotonic() + 10
    while not busy_at_release and time.monotonic() < deadline:
        time.sleep(0.02)
    engine.close()
    assert busy_at_release, "the engine went idle without handing the room's freed memory back"
    assert not any(busy_at_release), "memory was trimmed while runs were still in the batch"
