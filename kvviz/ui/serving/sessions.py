"""Many users on one app: what happens when a session ends, and how a failed job is reported.

``install(demo, ctx)`` wires the end of a session (the browser tab closed or reloaded) to freeing
everything that session holds: its Stop flag, its exported files, and — after a short grace
period for a reconnect — its ``gr.State`` traces. It also turns on Gradio's periodic deletion of
cached files, so nothing the app writes outlives ``Settings.file_max_age_s``.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Iterator
from contextlib import contextmanager

import gradio as gr

from kvviz.ui.serving import gradio_adapter
from kvviz.ui.serving.context import AppContext
from kvviz.ui.serving.jobs import UserError

log = logging.getLogger("kvviz")


def job_failed(exc: Exception, what: str = "Generation") -> str:
    """What the user reads when a job dies mid-way (the app and their earlier results are fine).

    Logs the traceback as text, then clears the failed frames' locals: a traceback kept alive by
    Gradio or a log handler would otherwise keep the job's KV cache in memory. Raise the
    ``gr.Error`` with ``from None`` so the exception chain does not hold it either.
    """
    log.error("%s failed:\n%s", what, "".join(traceback.format_exception(exc)))
    traceback.clear_frames(exc.__traceback__)
    return (
        f"{what} failed: {type(exc).__name__}: {str(exc)[:200]}. The job was ended and its memory "
        "freed; your earlier results are unchanged. Try again, perhaps with a shorter prompt."
    )


@contextmanager
def user_errors(what: str | None = None) -> Iterator[None]:
    """The library's ValueErrors become readable gr.Errors (gr.Error is itself a ValueError: keep it).

    With ``what`` (e.g. "Eviction run"), any other exception ends the job with :func:`job_failed`'s
    message instead of crashing the event.
    """
    try:
        yield
    except gr.Error:
        raise
    except ValueError as exc:
        raise UserError(str(exc)) from None
    except Exception as exc:
        if what is None:
            raise
        raise gr.Error(job_failed(exc, what), print_exception=False) from None


def install(demo: gr.Blocks, ctx: AppContext) -> None:
    """Free each session's data when it ends; delete cached files older than ``file_max_age_s``; make new
    sessions cheap to open (their component configs are built only if read)."""
    grace = ctx.settings.session_grace_s

    def end_session(request: gr.Request):
        ctx.end_session(request)
        # Gradio keeps a closed session's gr.State for an hour; a lecture hall of closed tabs would
        # hold every trace that long. Keep it only long enough for a reconnect.
        gradio_adapter.keep_closed_state_for(demo, getattr(request, "session_hash", None), grace)
        gradio_adapter.drop_expired_sessions(demo)

    with demo:
        demo.unload(end_session)
    gradio_adapter.build_session_configs_lazily()  # a room's new sessions no longer queue on the event loop
    age = ctx.settings.file_max_age_s
    demo.delete_cache = (max(60, age // 4), age)
