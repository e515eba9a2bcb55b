"""``gpu(fn, duration)``: run a handler inside Hugging Face ZeroGPU's ``spaces.GPU`` when that package is installed.

On ZeroGPU a GPU is attached only while a ``spaces.GPU``-decorated function runs, and the duration a call
asks for is checked against the visitor's remaining daily quota (about two minutes for a visitor who is not
logged in). So every model job asks for its own duration, computed per call from its cost estimate
(``duration`` may be a function of the handler's own arguments, as ``spaces.GPU`` accepts; see
:func:`kvviz.limits.lease_seconds`), and a refusal by the quota becomes a message in the page that says
what the job asked for. Everywhere else (``spaces`` not importable: a laptop, CI, a plain CPU or CUDA
server) ``gpu`` returns ``fn`` unchanged, so the CPU path stays the tested default. Handlers are wrapped
once, in :mod:`kvviz.ui.serving.model_job`.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
from collections.abc import Callable
from typing import TypeVar

from kvviz.limits import GPU_LEASE_CEILING_S
from kvviz.ui.serving.jobs import UserError

F = TypeVar("F", bound=Callable)
GPU_SECONDS = GPU_LEASE_CEILING_S  # what a handler asks for when it gives no duration of its own


def spaces_available() -> bool:
    """True where the ``spaces`` package (ZeroGPU) can be imported."""
    return importlib.util.find_spec("spaces") is not None


def quota_message(exc: BaseException, seconds: int | None) -> str | None:
    """What the page says when ZeroGPU's quota refused a call (None when ``exc`` is something else)."""
    text = str(exc)
    if "quota" not in text.lower():
        return None
    asked = f"it asks the GPU for {seconds} s, and " if seconds is not None else ""
    return (
        f"ZeroGPU refused this job: {asked}your GPU quota for today has less left ({text[:200]}). "
        "Log in to Hugging Face for a larger quota, or try a shorter job (a shorter prompt, fewer new tokens)."
    )


def gpu(fn: F, duration: int | Callable[..., int] = GPU_SECONDS) -> F:
    """``spaces.GPU(duration=…)(fn)`` on ZeroGPU, else ``fn`` itself (generators stay generators).

    ``duration``: seconds, or a function of ``fn``'s arguments returning seconds (asked once per call)."""
    if not spaces_available():
        return fn
    import spaces

    leased = spaces.GPU(duration=duration)(fn)

    def asked(args, kwargs) -> int | None:
        try:
            return int(duration(*args, **kwargs)) if callable(duration) else int(duration)
        except Exception:
            return None

    if inspect.isgeneratorfunction(fn):

        @functools.wraps(fn)
        def stream(*args, **kwargs):
            try:
                yield from leased(*args, **kwargs)
            except Exception as exc:
                message = quota_message(exc, asked(args, kwargs))
                if message is None:
                    raise
                raise UserError(message) from None

        return stream  # type: ignore[return-value]

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return leased(*args, **kwargs)
        except Exception as exc:
            message = quota_message(exc, asked(args, kwargs))
            if message is None:
                raise
            raise UserError(message) from None

    return call  # type: ignore[return-value]
