"""``gpu(fn, duration)``: run a handler inside Hugging Face ZeroGPU's ``spaces.GPU`` on a ZeroGPU Space.

On ZeroGPU a GPU is attached only while a ``spaces.GPU``-decorated function runs: the package asks its device
API for a GPU (``/schedule``, with the duration this call asks for), runs the function in a worker process
forked from the main one — reused for a later call when the device API says it is idle, so nothing may depend
on the worker's memory surviving or being lost — and pickles each result back. The duration is checked against
the visitor's remaining daily quota (about two minutes for a visitor who is not logged in), so every model job
asks for its own duration, computed per call from its cost estimate (``duration`` may be a function of the
handler's own arguments, as ``spaces.GPU`` accepts; see :func:`kvviz.limits.lease_seconds`).

Two things reach the visitor readable here. A refusal by ZeroGPU (quota, the Space's GPU limit, a duration
above the maximum, no GPU free) becomes a message that says what happened and what the job asked for
(:func:`quota_message`). An exception that is not a ``gr.Error`` is turned into one with its message inside the
worker (:func:`readable`): the package sends back only the class name of any other exception.

Everywhere else (not a ZeroGPU Space, or ``spaces`` not installed: a laptop, CI, a plain CPU or CUDA server)
``gpu`` returns ``fn`` unchanged, so the CPU path stays the tested default. Handlers are wrapped once, in
:mod:`kvviz.ui.serving.model_job`, which admits each job in the main process before its GPU call starts.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import logging
import traceback
from collections.abc import Callable
from typing import TypeVar

import gradio as gr

from kvviz.limits import GPU_LEASE_CEILING_S
from kvviz.settings import zero_gpu
from kvviz.ui.serving.jobs import UserError

F = TypeVar("F", bound=Callable)
GPU_SECONDS = GPU_LEASE_CEILING_S  # what a handler asks for when it gives no duration of its own
log = logging.getLogger("kvviz")


def spaces_available() -> bool:
    """True on a ZeroGPU Space (``SPACES_ZERO_GPU``) where the ``spaces`` package can be imported; elsewhere
    ``spaces.GPU`` does nothing, so kvviz does not wrap at all."""
    return zero_gpu() and importlib.util.find_spec("spaces") is not None


def _text(exc: BaseException) -> str:
    return str(getattr(exc, "message", None) or exc)


def quota_message(exc: BaseException, seconds: int | None) -> str | None:
    """What the page says when ZeroGPU refused or ended a call (None when ``exc`` is something else).

    Recognised by the ``spaces`` package's titles and texts (``spaces/zero/client.py``, ``wrappers.py``)."""
    text = _text(exc)
    seen = f"{getattr(exc, 'title', '') or ''} {text}".lower()
    asks = f"it asks the GPU for {seconds} s" if seconds is not None else "it asks the GPU for its estimated time"
    said = f"(ZeroGPU: {text[:200]})"
    shorter = "a shorter job (a shorter prompt, fewer new tokens) asks for less"
    if "illegal duration" in seen or "larger than the maximum" in seen:
        return f"ZeroGPU refused this job before it started: {asks}, more than one GPU call may last {said}. Try {shorter}."
    if "gpu limit" in seen:
        return (
            f"ZeroGPU refused this job before it started: {asks}, and this Space has used up the GPU time it may "
            f"spend on visitors it cannot identify {said}. This request carried no Hugging Face visitor token (an "
            "API client without one, or an example run at build time); open the app in a browser, logged in to "
            "Hugging Face, or send your token, so it counts against your own quota."
        )
    if "no gpu was available" in seen:
        return (
            "ZeroGPU had no GPU free for this job: every GPU of the shared pool is busy right now and nothing ran "
            f"{said}. Try again in a minute."
        )
    if "pending credits" in seen or "too many zerogpu credits" in seen:
        return f"ZeroGPU refused this job: your other GPU tasks still running hold your credits {said}. Wait for them to finish."
    if "quota" in seen or "runs limit" in seen:
        return (
            f"ZeroGPU refused this job before it started: {asks}, and your GPU quota for today has less left "
            f"{said}. Log in to Hugging Face for a larger quota, or try {shorter}."
        )
    if "gpu task aborted" in seen:
        return (
            "ZeroGPU ended this job before it finished (its GPU worker stopped, for example after running past the "
            f"duration it asked for, {seconds if seconds is not None else 'its estimate'} s). Try {shorter}."
        )
    return None


def refusal_reason(exc: BaseException) -> str:
    """One word for a ZeroGPU refusal, for ``/metrics`` (``quota_message`` says it in full)."""
    seen = f"{getattr(exc, 'title', '') or ''} {_text(exc)}".lower()
    for words, reason in (
        (("illegal duration", "larger than the maximum"), "zerogpu_duration"),
        (("gpu limit",), "zerogpu_space_limit"),
        (("no gpu was available",), "zerogpu_no_gpu"),
        (("quota", "runs limit", "credits"), "zerogpu_quota"),
    ):
        if any(w in seen for w in words):
            return reason
    return "zerogpu_aborted"


def readable(fn: F) -> F:
    """``fn`` whose exceptions other than ``gr.Error`` become one carrying their message (the ``spaces``
    package sends only ``gr.Error``\\s back whole; any other exception reaches the page as its class name)."""

    def turn(exc: Exception) -> gr.Error:
        log.error("%s failed in its GPU call:\n%s", fn.__name__, "".join(traceback.format_exception(exc)))
        traceback.clear_frames(exc.__traceback__)
        return gr.Error(f"{type(exc).__name__}: {str(exc)[:300]}", print_exception=False)

    if inspect.isgeneratorfunction(fn):

        @functools.wraps(fn)
        def stream(*args, **kwargs):
            try:
                yield from fn(*args, **kwargs)
            except gr.Error:
                raise
            except Exception as exc:
                raise turn(exc) from None

        return stream  # type: ignore[return-value]

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except gr.Error:
            raise
        except Exception as exc:
            raise turn(exc) from None

    return call  # type: ignore[return-value]


def gpu(fn: F, duration: int | Callable[..., int] = GPU_SECONDS) -> F:
    """``spaces.GPU(duration=…)(readable(fn))`` on ZeroGPU, else ``fn`` itself (generators stay generators).

    ``duration``: seconds, or a function of ``fn``'s arguments returning seconds (asked once per call)."""
    if not spaces_available():
        return fn
    import spaces

    leased = spaces.GPU(duration=duration)(readable(fn))

    def asked(args, kwargs) -> int | None:
        try:
            return int(duration(*args, **kwargs)) if callable(duration) else int(duration)
        except Exception:
            return None

    def refused(exc: Exception, args, kwargs) -> Exception:
        message = quota_message(exc, asked(args, kwargs))
        if message is None:
            return exc
        error = UserError(message)
        error.reason = refusal_reason(exc)  # type: ignore[attr-defined]  # counted by the caller (/metrics)
        return error

    if inspect.isgeneratorfunction(fn):

        @functools.wraps(fn)
        def stream(*args, **kwargs):
            try:
                yield from leased(*args, **kwargs)
            except Exception as exc:
                error = refused(exc, args, kwargs)
                if error is exc:
                    raise
                raise error from None

        return stream  # type: ignore[return-value]

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return leased(*args, **kwargs)
        except Exception as exc:
            error = refused(exc, args, kwargs)
            if error is exc:
                raise
            raise error from None

    return call  # type: ignore[return-value]
