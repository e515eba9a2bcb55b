"""The process's memory: how much it holds, how much it may have, and handing freed memory back to the OS.

The gate (:mod:`kvviz.admission`) refuses work above a ceiling set from :func:`machine_memory` and read with
:func:`current_rss`; the gate and the engine call :func:`release_when_idle` when their work ends, because glibc
keeps a finished job's freed heap and the ceiling would otherwise refuse work the machine has room for.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import threading
from collections.abc import Callable

from kvviz.limits import IDLE_RELEASE_S


def current_rss() -> int | None:
    """This process's resident memory in bytes (Linux ``/proc``; ``None`` where unknown)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _libc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS, Windows)."""
    try:
        name = ctypes.util.find_library("c")
        return None if name is None else getattr(ctypes.CDLL(name), "malloc_trim", None)
    except OSError:
        return None


_TRIM = _libc_trim()


def release_memory() -> None:
    """Hand the memory a finished job freed back to the OS: collect cycles, then ``malloc_trim(0)``.

    A job's tensors are freed when it ends, but glibc keeps freed heap pages in its arenas for the next
    allocation, so without this a server's resident memory stays at its busiest level after a wave of
    jobs (hundreds of MiB above idle for a room of short runs, gigabytes after long prompts), and the
    gate's memory ceiling (:meth:`Gate.check_memory`) then refuses work the machine has room for. Called
    when the model goes idle, so its cost (milliseconds) never lands inside a job.
    """
    gc.collect()
    if _TRIM is not None:
        _TRIM(0)


def freeze_startup() -> int:
    """Collect the start-up's garbage, then move everything still alive (modules, the model, the UI, some
    600 thousand objects for the app) out of the cycle collector's sight (:func:`gc.freeze`); returns how
    many were frozen.

    Those objects live as long as the process, but a full collection walks every one of them: a third of a
    second, holding the interpreter, whenever enough new objects have survived — during a room, that is
    inside 24 requests at once — and :func:`release_memory`'s idle-time ``gc.collect`` walks them too.
    Frozen objects are still freed by reference counting; only cycles among them would never be collected,
    and the start-up's cycles are collected first."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


_pending: dict[Callable[[], bool], threading.Timer] = {}  # one scheduled release per idle predicate
_pending_lock = threading.Lock()


def release_when_idle(
    idle: Callable[[], bool], after_s: float | None = None, release: Callable[[], None] | None = None
) -> None:
    """``release`` (:func:`release_memory`) once ``idle()`` has held for ``after_s`` seconds (:data:`IDLE_RELEASE_S`): in a
    thread of its own, later, not on the way out of the jobs that just ended. ``gc.collect`` walks the whole
    heap and ``malloc_trim`` runs holding the interpreter; called when a room's last run ends they held up the
    24 answers waiting to be sent. A newer call for the same ``idle`` restarts the wait. ``release`` lets a caller
    see its own releases apart from other engines' in the same process (the module's function is shared)."""
    delay = IDLE_RELEASE_S if after_s is None else after_s
    release = release_memory if release is None else release

    def fire() -> None:
        with _pending_lock:
            if _pending.get(idle) is not timer:
                return
            del _pending[idle]
        if idle():
            release()

    timer = threading.Timer(delay, fire)
    timer.daemon = True
    timer.name = "kvviz-release"
    with _pending_lock:
        old = _pending.pop(idle, None)
        if old is not None:
            old.cancel()
        _pending[idle] = timer
    timer.start()


# a container's memory limit: cgroup v2, then v1 ("max", or a huge number, where there is none)
CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def machine_memory() -> int | None:
    """The memory this process may have in bytes: the machine's, or its container's limit where that is smaller.

    A Space's container (16 GB on the free CPU tier) runs on a host with far more; the OS reports the host's, and
    a ceiling set from it would never refuse before the container is killed for memory."""
    try:
        total: int | None = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = None
    for path in CGROUP_LIMITS:
        try:
            with open(path) as f:
                raw = f.read().strip()
        except OSError:
            continue
        if raw.isdigit() and (total is None or int(raw) < total):
            total = int(raw)
        break
    return total
