"""The calling thread's OpenMP workers, handed back when it stops computing.

PyTorch's CPU kernels run in OpenMP parallel regions. With GNU OpenMP (libgomp, what the Linux wheels
ship), every thread that opens a parallel region keeps a pool of worker threads for the next one, and
idle workers spin a few milliseconds before sleeping, so the next region starts at once. But once the
pools of all threads together hold more threads than the process has CPUs, libgomp spins a hundred
rounds instead (its "throttled" spin): every region then waits for its workers to wake from a futex.
A token's forward opens hundreds of small regions, so a model driven from one thread while another
thread's pool merely exists runs far slower than the same work alone (docs/performance.md has the
figures) — and the server's engine is a thread, while the main thread keeps the pool it loaded the
model with.

:func:`release` hands the calling thread's pool back (``omp_pause_resource_all``: the workers exit; the
next parallel region builds a new pool, a thread start). Threads call it when they stop computing: the
engine's thread when it goes idle, a thread that hands its model work to the engine, the server's main
thread after start-up, a handler's thread after each call. Then only threads that compute hold pools,
and one computing thread alone gets the full-speed spin. A torch without libgomp (macOS, Windows, an
LLVM or Intel OpenMP build) spins by other rules: there it does nothing.
"""

from __future__ import annotations

import ctypes
import functools

OMP_PAUSE_SOFT = 1  # omp_pause_resource_t: the workers go, the runtime's state stays


@functools.cache
def _libgomps() -> tuple[ctypes.CDLL, ...]:
    """Every libgomp mapped into this process (torch's own copy; another library's too), opened by path."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libgomp" in line.rsplit("/", 1)[-1]}
    except OSError:  # not Linux: no libgomp pools to hand back
        return ()
    out = []
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)  # already loaded: the same handle, no second copy
            lib.omp_pause_resource_all.argtypes = [ctypes.c_int]
            lib.omp_pause_resource_all.restype = ctypes.c_int
        except (OSError, AttributeError):  # an old libgomp without OpenMP 5's pause
            continue
        out.append(lib)
    return tuple(out)


def available() -> bool:
    """True when this process's OpenMP is a libgomp whose pools :func:`release` can hand back."""
    import torch  # noqa: F401 — torch loads its libgomp; look for it only once it is mapped

    return bool(_libgomps())


def release() -> bool:
    """Hand back the calling thread's OpenMP worker pool, if it has one; True when every libgomp agreed
    (called inside a parallel region it refuses). Cheap when the thread holds no pool."""
    return all([lib.omp_pause_resource_all(OMP_PAUSE_SOFT) == 0 for lib in _libgomps()]) if available() else False
