"""kvviz.process_memory: this process's memory read, the ceiling's base set from the container, freed memory
handed back to the OS once the work has stayed idle."""

from __future__ import annotations

import gc
import time
import weakref

import pytest

from kvviz import process_memory
from kvviz.process_memory import current_rss


def no_release_pending() -> None:
    """Cancel the releases earlier tests' gates scheduled: one firing now would be counted as this test's."""
    with process_memory._pending_lock:
        for timer in process_memory._pending.values():
            timer.cancel()
        process_memory._pending.clear()


def test_current_rss_reads_this_process():
    rss = current_rss()
    assert rss is None or 10 * 2**20 < rss < 64 * 2**30


def test_a_release_scheduled_at_idle_is_dropped_when_work_comes_back_and_restarted_by_a_newer_idle(monkeypatch):
    no_release_pending()
    calls: list[str] = []
    monkeypatch.setattr(process_memory, "release_memory", lambda: calls.append("released"))
    state = {"idle": True}

    def idle() -> bool:
        return state["idle"]

    process_memory.release_when_idle(idle, after_s=0.05)
    state["idle"] = False  # a new room arrived before the wait ended: its step is not interrupted
    time.sleep(0.2)
    assert calls == []
    state["idle"] = True
    process_memory.release_when_idle(idle, after_s=0.3)
    process_memory.release_when_idle(idle, after_s=0.05)  # a newer idle restarts the wait: one release, not two
    time.sleep(0.5)
    assert calls == ["released"]


def test_release_memory_returns_a_fragmented_heap_to_the_os():
    """Freed small allocations with live neighbours stay resident under glibc until malloc_trim."""
    if current_rss() is None or process_memory._TRIM is None:
        pytest.fail("this test needs Linux /proc and glibc's malloc_trim, which the app's servers have")
    chunks = [b"x" * 60_000 for _ in range(5_000)]  # ~300 MB of heap chunks below glibc's mmap threshold
    keep = chunks[::50]  # one live chunk in every 50 pins the heap: free() alone cannot shrink it
    del chunks
    before = current_rss()
    process_memory.release_memory()
    after = current_rss()
    assert before is not None and after is not None
    assert before - after > 150 * 2**20, f"only {(before - after) / 2**20:.0f} MiB went back to the OS"
    assert len(keep) == 100


@pytest.mark.parametrize(
    "limit, expected_gb",
    [("17179869184\n", 16.0), ("max\n", None), (None, None)],  # a 16 GB Space's container; none; no cgroup
)
def test_the_memory_ceiling_is_set_from_the_container_s_limit_not_the_host_s(monkeypatch, tmp_path, limit, expected_gb):
    from kvviz.settings import default_max_rss_gb

    paths = []
    if limit is not None:
        (tmp_path / "memory.max").write_text(limit)
        paths.append(str(tmp_path / "memory.max"))
    monkeypatch.setattr(process_memory, "CGROUP_LIMITS", (*paths, str(tmp_path / "absent")))
    monkeypatch.setattr(process_memory.os, "sysconf", lambda name: {"SC_PAGE_SIZE": 4096}.get(name, 2**25))  # 128 GiB
    total = process_memory.machine_memory()
    assert total == (128 if expected_gb is None else expected_gb) * 2**30
    assert default_max_rss_gb() == 0.75 * total / 2**30  # 12 GiB on the 16 GB Space, 96 on the bare host


def test_freeze_startup_collects_the_start_up_s_cycles_then_hides_the_survivors_from_later_collections():
    class Node:
        pass

    kept, dropped = Node(), Node()
    kept.me = kept  # a cycle still referenced: frozen
    dropped.me = dropped  # a cycle nobody references: collected before the freeze, never frozen
    gone = weakref.ref(dropped)
    del dropped
    try:
        frozen = process_memory.freeze_startup()
        assert gone() is None
        assert frozen > 0 and gc.get_freeze_count() > 0  # (other threads may free frozen objects meanwhile)
        assert not any(o is kept for o in gc.get_objects())  # a later full collection no longer walks it
        later = Node()
        later.me = later
        still = weakref.ref(later)
        del later
        gc.collect()
        assert still() is None  # objects made after the freeze are collected as before
    finally:
        gc.unfreeze()
