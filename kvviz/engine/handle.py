"""A run the engine follows (:class:`Run`) and what its callers hold (:class:`Handle`): its growing Trace,
its progress, its end, and its cancellation. Kept apart from the engine's stepping so a caller's side
reads alone.

A Run is one computation; identical requests share it, each through a Handle that carries the
caller's :class:`~kvviz.cancel.Cancel` token. The Run has a token of its own, cancelled once every
caller's is, and its Generation reads that one."""

from __future__ import annotations

import copy
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator

from kvviz.cancel import ABANDONED, Cancel
from kvviz.capture.generation import Generation
from kvviz.capture.model_io import Progress
from kvviz.capture.trace import Trace
from kvviz.engine.prefix import Claim
from kvviz.limits import FINISHED_RUNS_BYTES


class Run:
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
        self.cancel = Cancel((self._abandoned, ABANDONED))
        gen.progress = self._report
        gen.should_stop = self.cancel

    def _report(self, p: Progress) -> None:
        self.progress = p
        self.changed()

    def changed(self) -> None:
        with self.cond:
            self.version += 1
            self.cond.notify_all()

    def _abandoned(self) -> bool:
        """True once every caller following this run has cancelled."""
        return all(h.cancel.cancelled for h in list(self.handles))

    def end(self, error: BaseException | None = None) -> None:
        # without the engine's frames: a traceback would keep the failed step's caches alive
        self.error = error.with_traceback(None) if error is not None else None
        self.finished = True
        self.changed()
        self.ended.set()


class Handle:
    """A caller's view of a submitted run: stream it, wait for it, or stop following it."""

    def __init__(self, run: Run, cancel: Cancel | None = None):
        self.run = run
        self.cancel = cancel or Cancel()  # the caller's token: cancelled, this caller stops following the run

    @property
    def trace(self) -> Trace:
        return self.run.gen.trace

    @property
    def progress(self) -> Progress | None:
        return self.run.progress

    def stream(self, report: Callable[[Progress], None] | None = None, poll: float = 0.25) -> Iterator[Trace]:
        """Yield the growing Trace whenever a step adds to it, then once more when the run is over
        (with the check, when asked); ``report`` hears the run's progress. Raises the run's error.

        A run stops when every caller following it has stopped it; a caller who stops a run others
        still follow gets the run to its end like them (it is theirs too, and finishes soon)."""
        run, seen, said = self.run, -1, None
        while True:
            with run.cond:
                if run.version == seen and not run.finished:
                    run.cond.wait(poll)
                version, finished = run.version, run.finished
            if report is not None and run.progress is not None and run.progress != said:
                said = run.progress
                report(said)
            if finished:
                if run.error is not None:  # a copy: the raised one's traceback must not tie this run to the run
                    raise copy.copy(run.error) from None
                yield run.gen.trace
                return
            if version != seen and run.gen.trace.steps:
                seen = version
                yield run.gen.trace
            seen = version

    def result(self) -> Trace:
        """Block until the run is over; its finished Trace. Raises the run's error. Sleeps until the end
        (the many callers of one shared run do not each wake at every step)."""
        run = self.run
        run.ended.wait()
        if run.error is not None:
            raise copy.copy(run.error) from None
        return run.gen.trace


class FinishedRuns:
    """The latest finished runs, by request key, so a late duplicate gets its answer at once: at most ``count``
    of them, their traces at most :data:`~kvviz.limits.FINISHED_RUNS_BYTES` together (the oldest go first)."""

    def __init__(self, count: int):
        self.count = count
        self._runs: OrderedDict[tuple, Run] = OrderedDict()

    def get(self, key: tuple) -> Run | None:
        """The finished run of this key (now the newest), or None."""
        run = self._runs.get(key)
        if run is not None:
            self._runs.move_to_end(key)
        return run

    def keep(self, run: Run) -> None:
        """Keep ``run``; drop the oldest past the count or the bytes."""
        self._runs[run.key] = run
        kept = sum(j.gen.trace.nbytes() for j in self._runs.values())
        while self._runs and (len(self._runs) > self.count or kept > FINISHED_RUNS_BYTES):
            kept -= self._runs.popitem(last=False)[1].gen.trace.nbytes()


def wait_all(handles: list[Handle], timeout: float) -> bool:
    """True when every handle's run ended within ``timeout`` seconds (tests and benches)."""
    end = time.monotonic() + timeout
    for h in handles:
        with h.run.cond:
            while not h.run.finished:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                h.run.cond.wait(left)
    return True
