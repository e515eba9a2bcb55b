"""Ready examples: the show-me results computed once in the background, shared by every session.

Tabs plan the results their demo buttons need on ``ctx.store`` (:class:`~kvviz.demo_store.DemoStore`)
and read them with :func:`shared`; :func:`start` computes the plan in a daemon thread after the app
is built, one result at a time, each through the admission gate (session ``kvviz-precompute``) and
only while no user job runs or waits (Generate runs included), so the server starts at once and people never queue long
behind it. A request for a result still being prepared waits for that computation and shows its
progress; "Recompute live" skips the store and runs through the gate like any job.

Every result computed is also written to disk (:class:`~kvviz.demo_files.DemoFiles`, under
``settings.results_dir``, keyed by model, its dtype and device, kvviz version and machine), and :func:`restore` reads them back
before the server answers, so a restarted server (a Space waking up) answers every show-me at once. The
results read back are computed again in the background once the room has had the server to itself for
:data:`REFRESH_AFTER_S`; until then the stored ones are served. ZeroGPU reads them too but computes none.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import gradio as gr

from kvviz import openmp
from kvviz.admission import Refused
from kvviz.demo_files import DemoFiles, NotStorable, Unreadable, code_version
from kvviz.demo_store import Compute, Entry
from kvviz.examples import GENERATE_EXAMPLE, examples
from kvviz.ui.serving.context import AppContext
from kvviz.ui.serving.job import Job

log = logging.getLogger("kvviz")
SESSION = "kvviz-precompute"
IDLE_POLL_S = 0.5
LIVE_LABEL = "Recompute live (skip the result computed at start-up)"
# stored results are computed again only after this long: the first minute after a restart belongs to the
# room that woke the server (their show-mes are answered from the store meanwhile)
REFRESH_AFTER_S = 60.0


def live_box(elem_id: str) -> gr.Checkbox:
    """The "Recompute live" checkbox beside a demo button."""
    return gr.Checkbox(False, label=LIVE_LABEL, elem_id=elem_id, container=False)


def _gate_idle(ctx: AppContext) -> bool:
    """No user job runs or waits: neither at the gate nor among the Generate runs the engine decodes
    (they pass the room's own gate, and a start-up example beside them would take half the cores)."""
    snaps = [ctx.jobs.gate.snapshot(), ctx.jobs.room.snapshot()]
    return all(s["running"] == 0 and s["waiting"] == 0 for s in snaps)


def disk(ctx: AppContext) -> DemoFiles | None:
    """The folder of stored results for this model in its dtype on its device, code and machine (None when the
    settings keep none): a bf16 server never reads back an fp32 server's results."""
    if not ctx.settings.results_dir:
        return None
    runs_as = f"{str(ctx.lm.dtype).removeprefix('torch.')} on {ctx.lm.device.type}"
    return DemoFiles(Path(ctx.settings.results_dir), ctx.lm.name, code_version(), runs_as=runs_as)


def restore(ctx: AppContext) -> int:
    """Before the server answers: every planned result an earlier start stored is put back (how many), and
    every new result will be stored. A file that does not load is removed and its result computed again."""
    files = disk(ctx)
    if files is None:
        return 0

    def save(entry: Entry) -> None:
        try:
            files.save(entry.key, entry.value, entry.label, entry.seconds)
        except NotStorable as exc:
            log.warning("not stored on disk (%s): %s", exc, entry.label)
        except OSError:
            log.exception("storing a result failed: %s", entry.label)

    ctx.store.on_done = save
    n = 0
    t0 = time.perf_counter()
    for entry in ctx.store.entries():
        try:
            found = files.load(entry.key)
        except Unreadable as exc:
            log.warning("stored result refused, computing it again (%s)", exc)
            files.remove(entry.key)
            continue
        if found is None:
            continue
        value, head = found
        try:
            n += ctx.store.restore(entry, value, head.get("saved_at"), head.get("seconds"))
        except Exception:
            log.exception("putting back a stored result failed: %s", entry.label)
    if n:
        log.info(
            "%d of %d show-me results read back from %s in %.1f s",
            n,
            len(ctx.store.entries()),
            files.folder,
            time.perf_counter() - t0,
        )
    return n


def _wait_room_quiet(ctx: AppContext, since: float, stop: threading.Event | None) -> bool:
    """Sleep until :data:`REFRESH_AFTER_S` after ``since``; False if the server is stopping."""
    while time.monotonic() - since < REFRESH_AFTER_S:
        if stop is not None and stop.wait(IDLE_POLL_S):
            return False
        if stop is None:
            time.sleep(IDLE_POLL_S)
    return True


def run_plan(ctx: AppContext, stop: threading.Event | None = None) -> None:
    """Compute every pending planned result, each when the gate is idle (users go first); then, after
    :data:`REFRESH_AFTER_S`, compute again those read back from disk."""
    since = time.monotonic()
    _compute_pending(ctx, stop)
    stale = [e for e in ctx.store.entries() if e.stale]
    if not stale or not _wait_room_quiet(ctx, since, stop):
        return
    for entry in stale:
        if not _turn(ctx, entry, stop):
            return


def _stopping(stop: threading.Event | None) -> Callable[[], bool]:
    return (lambda: stop.is_set()) if stop is not None else (lambda: False)


@contextmanager
def _idle_slot(ctx: AppContext, label: str, stopping: Callable[[], bool]) -> Iterator[bool]:
    """Hold the gate for one start-up job, taken only once the gate is idle so users go first; yields
    False (holding nothing) when the server stops before the slot is granted."""
    while not stopping():
        if not _gate_idle(ctx):
            time.sleep(IDLE_POLL_S)
            continue
        try:
            ticket = ctx.jobs.gate.admit(SESSION, f"start-up example: {label}")
        except Refused:
            time.sleep(IDLE_POLL_S)
            continue
        with ticket:
            try:
                ticket.wait()
            except Refused:  # the server is stopping (its gate cancelled the line)
                yield False
                return
            yield True
            return
    yield False


def _turn(ctx: AppContext, entry: Entry, stop: threading.Event | None) -> bool:
    """Refresh one stale entry through the gate once it is idle; False once the server is stopping."""
    stopping = _stopping(stop)
    with _idle_slot(ctx, entry.label, stopping) as granted:
        if not granted:
            return False
        try:
            if ctx.store.refresh(entry, stopping):
                log.info("refreshed stored example: %s (%.1f s)", entry.label, entry.seconds or 0.0)
        except Exception:
            log.exception("refreshing a stored example failed: %s", entry.label)
        return True


def _compute_pending(ctx: AppContext, stop: threading.Event | None = None) -> None:
    """Compute every pending planned result, each when the gate is idle (users go first)."""
    stopping = _stopping(stop)
    for entry in ctx.store.entries():
        while entry.state == "pending" and not stopping():
            with _idle_slot(ctx, entry.label, stopping) as granted:
                if not granted:
                    return
                claimed, mine = ctx.store.claim(entry.key)
                if not mine:
                    break
                try:
                    ctx.store.run(entry, "start-up", stopping)
                    log.info("ready example: %s (%.1f s)", entry.label, entry.seconds or 0.0)
                except Exception:
                    log.exception("start-up example failed: %s", entry.label)
                    return


def warm(ctx: AppContext) -> None:
    """Before the server takes requests (unless KVVIZ_WARM=0): the Generate tab's example through the
    engine for one token (:meth:`~kvviz.engine.engine.Engine.warm`), so the first room finds the chat
    template and system prompt in the prefix cache and the model's first forward already done. A failure
    is logged; the first requests then compute everything themselves."""
    if not ctx.settings.warm:
        return
    prompt, chat = examples()[GENERATE_EXAMPLE]
    t0 = time.perf_counter()
    try:
        trace = ctx.engine.warm(prompt, chat=chat)
    except Exception:
        log.exception("start-up warm-up failed")
        return
    log.info("warm-up: %d prompt tokens through the engine in %.1f s", trace.n_prompt, time.perf_counter() - t0)


def start(ctx: AppContext, stop: threading.Event | None = None) -> threading.Thread | None:
    """Compute the plan in the background (unless KVVIZ_PRECOMPUTE=0); returns the thread. Setting ``stop``
    ends it at the computation's next step (the server is stopping)."""
    if not ctx.settings.precompute or not ctx.store.entries():
        return None
    thread = threading.Thread(target=run_plan, args=(ctx, stop), name="kvviz-precompute", daemon=True)
    thread.start()
    return thread


def wait_for(entry: Entry, progress: Callable[[float, str], None] | None = None, poll: float = 0.25) -> bool:
    """Wait for the computation running for ``entry``, reporting its progress; True once it is done."""
    while entry.state == "running":
        entry.wait(poll)
        if progress is not None and entry.state == "running":
            progress(entry.fraction, f"Being prepared at start-up ({entry.label}): {entry.desc}".rstrip(": "))
    return entry.state == "done"


def _slot(job: Job, entry: Entry | None, poll: float = 0.5) -> None:
    """The job's turn at the gate; while it waits, the progress bar says what the server is preparing first
    (a start-up example holds the model) instead of a silent wait."""
    ticket = job.admit()
    while not ticket.wait(poll):
        running = [e for e in job.ctx.store.entries() if e.state == "running"]
        if running:
            r = running[0]
            mine = f" ({entry.label} is next)" if entry is not None and entry is not r else ""
            job.progress(
                r.fraction, f"Not ready yet: the server is preparing {r.label}, {100 * r.fraction:.0f} % done{mine}"
            )
        else:
            pos = ticket.position()
            job.progress(0.0, f"Queued: position {max(pos, 1)}, waiting for the model")


def shared(job: Job, key: Hashable, compute: Compute, *, live: bool) -> tuple[Any, Entry | None]:
    """The result for ``key`` and its store entry (None when computed just for this request).

    Ready: returned at once. Being computed: waited for. Otherwise computed now, through the gate
    under this call's slot (:meth:`Job.slot`, the job's declared size), and kept if ``key`` is planned.
    ``live`` always computes afresh.
    """
    ctx, progress = job.ctx, job.progress
    entry = None if live else ctx.store.entry(key)
    if entry is not None and entry.state != "pending" and wait_for(entry, progress):
        return entry.value, entry
    _slot(job, None if live else ctx.store.entry(key))
    claimed, mine = (None, False) if live else ctx.store.claim(key)
    if claimed is not None and not mine:  # someone else started it while this job waited its turn
        job.release()
        if wait_for(claimed, progress):
            return claimed.value, claimed
        return compute(progress, job.cancel), None
    if claimed is not None:
        value = ctx.store.run(claimed, "a request", job.cancel, progress)
        return value, (claimed if claimed.state == "done" else None)
    return compute(progress, job.cancel), None


MEMO_LIMIT = 256  # outputs kept per trace listener (a few per stored trace and setting)


def memo_listener(ctx: AppContext, fn: Callable) -> Callable:
    """A trace listener that keeps its outputs for shared (stored) traces, so every session's show-me reuses
    them; other traces are drawn each time."""
    kept: dict[tuple, Any] = {}
    lock = threading.Lock()

    def drawn(*args):
        trace = args[0] if args else None
        if trace is None or not ctx.store.is_shared(trace):
            return fn(*args)
        key = (id(trace), repr(args[1:]))
        with lock:
            if key in kept:
                return kept[key]
        out = fn(*args)
        with lock:
            if len(kept) >= MEMO_LIMIT:
                kept.clear()
            kept[key] = out
        return out

    def listener(*args):
        try:
            return drawn(*args)
        finally:  # a worker thread of Gradio's pool drew it: its OpenMP workers would slow the engine (kvviz.openmp)
            openmp.release()

    listener.__name__ = getattr(fn, "__name__", "listener")
    return listener


def share_trace(ctx: AppContext, trace: Any) -> None:
    """A stored trace: mark it shared and draw every view of it once, with the views' opening settings."""
    ctx.store.share(trace)
    for fn, inputs, _ in ctx.listeners:
        if not inputs or inputs[0] is not ctx.trace_state:
            continue
        try:
            fn(trace, *[getattr(c, "value", None) for c in inputs[1:]])
        except Exception:
            log.exception("drawing a stored trace's view failed")


def origin(entry: Entry | None) -> str:
    """Where a shown result came from, for the page: "computed at start-up (20:51 UTC, 18.3 s)", or "computed now"."""
    if entry is None or entry.finished_at is None:
        return "computed now"
    when = datetime.fromtimestamp(entry.finished_at, tz=timezone.utc).strftime("%H:%M UTC")
    if entry.source == "stored":
        when = datetime.fromtimestamp(entry.finished_at, tz=timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        return (
            f"computed by an earlier start of this server ({when}, took {entry.seconds or 0.0:.1f} s), read from disk"
        )
    where = "at start-up" if entry.source == "start-up" else "on a first request"
    return f"computed {where} ({when}, took {entry.seconds or 0.0:.1f} s)"


def readiness(ctx: AppContext) -> str:
    """One line for the Learn tab: how many ready examples are there, and what is being computed."""
    entries = ctx.store.entries()
    done = sum(e.state == "done" for e in entries)
    if not entries:
        return ""
    stored = sum(e.state == "done" and e.source == "stored" for e in entries)
    kept = f" ({stored} read back from an earlier start, computed again in the background)" if stored else ""
    if done == len(entries):
        return f"**Ready:** all {len(entries)} show-me examples are computed{kept}; every show-me answers at once."
    running = [e for e in entries if e.state == "running"]
    now = f" Now: {running[0].label} ({100 * running[0].fraction:.0f} %)." if running else ""
    off = "" if ctx.settings.precompute else " (Start-up computing is off: each is computed on its first click.)"
    return f"**Preparing examples:** {done} of {len(entries)} ready{kept}.{now}{off}"
