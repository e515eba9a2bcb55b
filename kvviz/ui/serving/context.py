"""What every tab's ``build(ctx)`` receives: the shared model, the limits, and per-session state."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gradio as gr

from kvviz.capture.model_io import model_info
from kvviz.capture.trace import ModelInfo
from kvviz.demo_store import DemoStore
from kvviz.engine.disk_tier import DiskTier
from kvviz.engine.engine import Engine
from kvviz.models import LoadedModel, cache_root
from kvviz.safety import SessionFiles
from kvviz.settings import Settings
from kvviz.ui.serving.identity import ANONYMOUS, session_of
from kvviz.ui.serving.jobs import Jobs


@dataclass
class ShowMeAnswer:
    """A demo button's result given in a show-me's own click event, instead of pressing the button after it.

    ``fn(request, *values of inputs)`` returns what ``outputs`` show, ``{component: value}`` — only when it is at
    hand (a stored result, or arithmetic) — else None, and the show-me presses the button as a user would.
    """

    inputs: list
    outputs: list
    fn: Callable[..., dict | list | tuple | None]


@dataclass
class AppContext:
    """Built once per app. The model is shared read-only; per-user data lives in ``trace_state``.

    ``trace_state`` holds the session's latest finished :class:`~kvviz.capture.trace.Trace` (or None).
    A tab that should refresh when a new trace arrives calls :meth:`on_trace`; the Generate tab
    chains those listeners after each run.
    """

    lm: LoadedModel
    settings: Settings
    trace_state: gr.State | None = None
    listeners: list[tuple[Callable, list, list]] = field(default_factory=list)
    # main inputs of each tab, by "<tab>.<name>" (e.g. "memory.preset"), so the Learn tab's
    # "show me" buttons can load an example into another view; ``tabs`` switches views (ids = module names)
    components: dict[str, gr.components.Component] = field(default_factory=dict)
    tabs: gr.Tabs | None = None
    # the hidden box a handler writes the tab to open into (kvviz/ui/page/tab_switch.py: no server event names
    # the bar)
    tab_box: gr.Textbox | None = None
    stop_flags: dict[str, threading.Event] = field(default_factory=dict)
    # ready results shared by every session (one store per app, so one per server process), and per
    # demo button ("nocache.button") how to plan the result a show-me's values will ask it for (returns its key)
    store: DemoStore = field(default_factory=DemoStore)
    planners: dict[str, Callable[[dict], Hashable]] = field(default_factory=dict)
    # per demo button ("memory.button"), how a show-me shows its result in one event (see ShowMeAnswer)
    answers: dict[str, ShowMeAnswer] = field(default_factory=dict)
    # per demo button, a show-me's "Look for" line read from its stored result (None until it is computed)
    look_fors: dict[str, Callable[[dict], str | None]] = field(default_factory=dict)
    # per tab id ("tab_quant"), its ready example and the line that names it: drawn on the tab's first open
    # (kvviz/ui/page/first_sight.py; typed loosely so serving does not import the page layer)
    examples: dict[str, tuple[Any, gr.Markdown]] = field(default_factory=dict)
    # every file written for a user lives in that session's temp folder
    files: SessionFiles = field(default_factory=SessionFiles)
    _info: ModelInfo | None = None
    _jobs: Jobs | None = None
    _engine: Engine | None = None

    @property
    def info(self) -> ModelInfo:
        if self._info is None:
            self._info = model_info(self.lm)
        return self._info

    @property
    def jobs(self) -> Jobs:
        """The one gate to the model for every session (admission, fair shares, time budget)."""
        if self._jobs is None:
            self._jobs = Jobs(self.settings, self.info)
        return self._jobs

    @property
    def engine(self) -> Engine:
        """The one engine that decodes every session's Generate runs together (``kvviz.engine``)."""
        if self._engine is None:
            s = self.settings
            disk = (
                DiskTier(cache_root().parent / "prefix-blocks", s.prefix_disk_mb * 2**20) if s.prefix_disk_mb else None
            )
            self._engine = Engine(
                self.lm,
                max_batch=s.batch_size,
                prefix_cache_bytes=s.prefix_cache_mb * 2**20,
                prefix_disk=disk,
                session_salt=s.cache_salt,
                gather_s=s.gather_ms / 1000,
                gather_max_s=3 * s.gather_ms / 1000,
            )
        return self._engine

    def close(self, timeout: float = 5.0) -> bool:
        """The server is stopping: every model job ends (the gates' running jobs at their next step, the
        engine's runs after its current step, Stop pressed for every session), waited for up to ``timeout``
        seconds; then every session's files are deleted. True once no model work is left running."""
        deadline = time.monotonic() + timeout
        for flag in list(self.stop_flags.values()):
            flag.set()
        gates = [] if self._jobs is None else [self._jobs.gate, self._jobs.room]
        for gate in gates:
            gate.close()
        stopped = self._engine is None or self._engine.close(timeout)
        while any(g.snapshot()["running"] for g in gates) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.files.cleanup()
        return stopped and not any(g.snapshot()["running"] for g in gates)

    def on_trace(self, fn: Callable, inputs: list, outputs: list, first: bool = False) -> None:
        """Run ``fn(*inputs)`` → ``outputs`` after every new trace (inputs usually start with trace_state);
        ``first`` puts it before the listeners already registered (a quick one the page should see at once)."""
        self.listeners.insert(0 if first else len(self.listeners), (fn, inputs, outputs))

    def stop_flag(self, request: gr.Request | None) -> threading.Event:
        """The session's Stop flag (keyed by session, never shared between users); a request without a session
        gets one of its own, not kept (no other request can name its session to press Stop)."""
        key = session_of(request)
        if key.startswith(ANONYMOUS):
            return threading.Event()
        return self.stop_flags.setdefault(key, threading.Event())

    def forget_session(self, request: gr.Request | None) -> None:
        self.stop_flags.pop(session_of(request), None)

    # per-session exports and the end of a session
    def session_dir(self, request: gr.Request | None) -> Path:
        """A fresh folder for one export, inside the session's own temp folder (deleted when it ends)."""
        return self.files.run_folder(session_of(request))

    def end_session(self, request: gr.Request | None) -> None:
        """The user closed the page: drop their Stop flag and delete their files."""
        self.forget_session(request)
        self.files.forget(session_of(request))
