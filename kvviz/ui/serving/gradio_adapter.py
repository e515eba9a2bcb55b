"""Gradio internals kvviz relies on: the per-session ``gr.State`` store and how long a closed session keeps it.

Gradio keeps a closed session's ``gr.State`` values for an hour (``SessionState.STATE_TTL_WHEN_CLOSED``)
and offers no public setting for it; a room of closed tabs would hold every trace that long. These
functions are the only code that reads ``Blocks.state_holder``; ``tests/adapters`` checks them
against the installed Gradio.

A new session's first event also builds the config of every component on the page (for Gradio's
deep-link route, which kvviz does not use) on the server's event loop: ~55 ms for kvviz's ~640
components, so a room of students pressing at once queued behind each other's sessions before any
handler ran. :func:`build_session_configs_lazily` defers that to the first read.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

import gradio as gr
from gradio.state_holder import SessionState


def session_states(demo: gr.Blocks) -> MutableMapping | None:
    """Session hash → Gradio's session state, or None before the app is served."""
    holder = getattr(demo, "state_holder", None)
    return getattr(holder, "session_data", None)


def keep_closed_state_for(demo: gr.Blocks, session_hash: str | None, seconds: int) -> bool:
    """Keep a closed session's ``gr.State`` values only ``seconds`` long; False when the session is unknown."""
    sessions = session_states(demo)
    state = None if sessions is None or session_hash is None else sessions.get(session_hash)
    if state is None:
        return False
    state.STATE_TTL_WHEN_CLOSED = seconds
    return True


def drop_expired_sessions(demo: gr.Blocks) -> int:
    """Forget closed sessions whose values Gradio has already expired; returns how many."""
    sessions = session_states(demo)
    if sessions is None:
        return 0
    gone = [
        key
        for key, state in list(sessions.items())
        if getattr(state, "is_closed", False) and not getattr(state, "state_data", True)
    ]
    for key in gone:
        sessions.pop(key, None)
    return len(gone)


def state_values(demo: gr.Blocks) -> dict[str, list]:
    """Session hash → the ``gr.State`` values Gradio holds for it now (tests count the traces in memory)."""
    sessions = session_states(demo) or {}
    return {key: list(state.state_data.values()) for key, state in list(sessions.items())}


class _LazyConfigs(dict):
    """A session's component configs, built for every block when first iterated (Gradio's deep-link
    route reads them that way); single keys are set and read as Gradio does with the eager dict."""

    def __init__(self, state: SessionState, blocks: gr.Blocks):
        super().__init__()
        self._state, self._blocks, self._complete = state, blocks, False

    def _fill(self) -> None:
        if self._complete:
            return
        self._complete = True
        config, early = self._state.blocks_config, dict(super().items())
        super().clear()  # in the blocks' order, as Gradio's eager dict; configs set before are kept
        for key, block in config.blocks.items():
            if key in self._blocks.blocks:
                dict.__setitem__(self, key, early.pop(key) if key in early else config.config_for_block(key, [], block))
        super().update(early)

    def items(self):  # type: ignore[override]
        self._fill()
        return super().items()

    def values(self):  # type: ignore[override]
        self._fill()
        return super().values()

    def keys(self):  # type: ignore[override]
        self._fill()
        return super().keys()

    def __iter__(self):
        self._fill()
        return super().__iter__()

    def __len__(self) -> int:
        self._fill()
        return super().__len__()


class _NoBlocks:
    """The Blocks as ``SessionState.__init__`` sees it, with no blocks to build configs for."""

    def __init__(self, blocks: gr.Blocks):
        self._blocks = blocks
        self.blocks: dict = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._blocks, name)


_EAGER_INIT = SessionState.__init__


def _lazy_init(self: SessionState, blocks: gr.Blocks) -> None:
    _EAGER_INIT(self, _NoBlocks(blocks))
    self.config_values = _LazyConfigs(self, blocks)


def build_session_configs_lazily(enable: bool = True) -> None:
    """New sessions build their component configs when first read, not on the event loop at their first
    event (``enable=False`` restores Gradio's own behaviour). Affects every Blocks in the process."""
    SessionState.__init__ = _lazy_init if enable else _EAGER_INIT  # type: ignore[method-assign]


# Gradio checks a slider's typed number against its range in Slider.preprocess and raises "Value 99 is greater
# than maximum value 29.", naming no control, before any handler runs. Sliders registered here pass the number
# to the handler instead, which says what to fix in the app's words. They are known by elem_id: Gradio's
# per-session copy of a component is rebuilt from its constructor arguments on an update (a new instance of
# the class, elem_id kept), so a patch on one instance would not survive.
_TYPED_SLIDERS: set[str] = set()
_SLIDER_PREPROCESS = gr.Slider.preprocess


def _typed_preprocess(self: gr.Slider, payload: Any) -> Any:
    if self.elem_id in _TYPED_SLIDERS:
        return payload
    return _SLIDER_PREPROCESS(self, payload)


def pass_typed_values(slider: gr.Slider) -> gr.Slider:
    """``slider`` (which must have an elem_id) gives its handlers the number as typed, out of range included."""
    if not slider.elem_id:
        raise ValueError("a slider that passes typed values needs an elem_id")
    _TYPED_SLIDERS.add(slider.elem_id)
    gr.Slider.preprocess = _typed_preprocess  # type: ignore[method-assign]
    return slider
