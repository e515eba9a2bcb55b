"""Gradio internals kvviz relies on: the per-session ``gr.State`` store and how long a closed session keeps it.

Gradio keeps a closed session's ``gr.State`` values for an hour (``SessionState.STATE_TTL_WHEN_CLOSED``)
and offers no public setting for it; a room of closed tabs would hold every trace that long. These
functions are the only code that reads ``Blocks.state_holder``; ``tests/adapters`` checks them
against the installed Gradio.
"""

from __future__ import annotations

from collections.abc import MutableMapping

import gradio as gr


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
