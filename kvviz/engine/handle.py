"""A run the engine follows (:class:`Job`) and what its callers hold (:class:`Handle`): its growing Trace,
its progress, its end, and Stop. Kept apart from the engine's stepping so a caller's side reads alone."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Iterator

from kvviz.capture.generation import Generation
from kvviz.capture.model_io import Progress
from kvviz.capture.trace import Trace
from kvviz.engine.prefix import Claim


class Job:
    """One computation and the callers following it."""

    def __init__(self, gen: Generation, owner: str | None = None, key: tuple | None = None, keep_turn: bool = False):
        self.gen = gen
        self.key = gen.key() if key is None else key  # what an identical request shares it by
        self.keep_turn = keep_turn  # a chat turn: its prompt and answer stay in the prefix store when it ends
        self.handles: list[Handle] = []
        self.owners: set[str | None] = {owner}  # who sent it (None: the server): see PrefixStore.blocks
        self.claim = Claim([], [])
        self.claimed = False  # looked up in the prefix store (once, before its first forward)
        self.progress: Progress | None = None
        self.version = 0  # bumped whenever the trace or the progress changes
        self.finished = False
        self.error: BaseException | None = None
        self.cond = threading.Condition()
        self.ended = threading.Event()  # set once finished: callers waiting for the end only sleep on it
        gen.progress = self._report
        gen.should_stop = self.abandoned

    def _report(self, p: Progress) -> None:
        self.progress = p
        self.changed()

    def changed(self) -> None:
        with self.cond:
            self.version += 1
            self.cond.notify_all()

    def abandoned(self) -> bool:
        """True once every caller following this run has stopped it."""
        return all(h.stopped() for h in list(self.handles))

    def end(self, error: BaseException | None = None) -> None:
        # without the engine's frames: a traceback would keep the failed step's caches alive
        self.error = error.with_traceback(None) if error is not None else None
        self.finished = True
        self.changed()
        self.ended.set()


class Handle:
    """A caller's view of a submitted run: stream it, wait for it, or stop following it."""

    def __init__(self, job: Job, should_stop: Callable[[], bool] | None = None):
        self.job = job
        self._should_stop = should_stop
        self._stopped = False

    def stopped(self) -> bool:
        if not self._stopped and self._should_stop is not None and self._should_stop():
            self._stopped = True
        return self._stopped

    def stop(self) -> None:
        self._stopped = True

    @property
    def trace(self) -> Trace:
        return self.job.gen.trace

    @property
    def progress(self) -> Progress | None:
        return self.job.progress

    def stream(self, report: Callable[[Progress], None] | None = None, poll: float = 0.25) -> Iterator[Trace]:
        """Yield the growing Trace whenever a step adds to it, then once more when the run is over
        (with the check, when asked); ``report`` hears the run's progress. Raises the run's error.

        A run stops when every caller following it has stopped it; a caller who stops a run others
        still follow gets the run to its end like them (it is theirs too, and finishes soon)."""
        job, seen, said = self.job, -1, None
        while True:
            with job.cond:
                if job.version == seen and not job.finished:
                    job.cond.wait(poll)
                version, finished = job.version, job.finished
            if report is not None and job.progress is not None and job.progress != said:
                said = job.progress
                report(said)
            if finished:
                if job.error is not None:  # a copy: the raised one's traceback must not tie this run to the job
                    raise copy.copy(job.error) from None
                yield job.gen.trace
                return
            if version != seen and job.gen.trace.steps:
                seen = version
                yield job.gen.trace
            seen = version

    def result(self) -> Trace:
        """Block until the run is over; its finished Trace. Raises the run's error. Sleeps until the end
        (the many callers of one shared run do not each wake at every step)."""
        job = self.job
        job.ended.wait()
        if job.error is not None:
            raise copy.copy(job.error) from None
        return job.gen.trace


def wait_all(handles: list[Handle], timeout: float) -> bool:
    """True when every handle's run ended within ``timeout`` seconds (tests and benches)."""
    end = time.monotonic() + timeout
    for h in handles:
        with h.job.cond:
            while not h.job.finished:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                h.job.cond.wait(left)
    return True
