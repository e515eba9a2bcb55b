"""A stand-in for Hugging Face's ``spaces`` package that behaves like ZeroGPU's process model, on CPU.

On ZeroGPU the main Gradio process has no usable GPU; a ``@spaces.GPU`` function runs in a worker
process forked for the call, which holds the GPU while it runs. Its return value, and each item a
generator yields, are pickled back to the main process; nothing the worker changes in memory survives
it, and threads of the main process (an engine's stepping thread, say) do not exist in it. This
package does the same with ``os.fork`` so the tests catch a design that only works in one process.

Only the tests put it on ``sys.path`` (``tests/zerogpu``); nothing else may import it. Knobs, from the
environment so a served app in a subprocess obeys them too:

- ``FAKE_ZEROGPU_LOG``: a file that gets one JSON line per call (function, requested seconds, pid);
- ``FAKE_ZEROGPU_QUOTA_S``: seconds a visitor has left; a call asking for more is refused, as
  ZeroGPU refuses it, before any work starts.

With a log set, importing it also hooks every ``torch.nn.Module`` forward: one outside a GPU call (where ZeroGPU's main
process has no GPU to run it) is written to the log as ``{"outside": <module>}``, once per process.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import pickle
import signal
import traceback
from collections.abc import Callable
from multiprocessing import get_context
from typing import Any

__all__ = ["GPU", "held"]
_HELD = False
_REPORTED = False


def held() -> bool:
    """True inside a ``GPU`` call's worker: the process that holds the (emulated) GPU."""
    return _HELD


class QuotaExceeded(Exception):
    """Raised like ZeroGPU's refusal when a call asks for more seconds than the visitor has left."""


def _requested(duration: int | float | Callable, args: tuple, kwargs: dict) -> float:
    seconds = duration(*args, **kwargs) if callable(duration) else duration
    return float(seconds)


def _log(fn: Callable, seconds: float) -> None:
    path = os.environ.get("FAKE_ZEROGPU_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"fn": fn.__qualname__, "duration": seconds, "pid": os.getpid()}) + "\n")


def _forward_outside(module, _inputs) -> None:
    global _REPORTED
    if not _HELD and not _REPORTED:
        _REPORTED = True
        path = os.environ.get("FAKE_ZEROGPU_LOG")
        if path:
            with open(path, "a") as f:
                f.write(json.dumps({"outside": type(module).__name__, "pid": os.getpid()}) + "\n")


def _check_quota(seconds: float) -> None:
    quota = os.environ.get("FAKE_ZEROGPU_QUOTA_S")
    if quota is not None and seconds > float(quota):
        raise QuotaExceeded(
            f"You have exceeded your GPU quota ({float(quota):.0f}s left, {seconds:.0f}s requested). Try again later."
        )


def _send(conn, kind: str, value: Any) -> None:
    try:
        payload = pickle.dumps((kind, value))
    except Exception as exc:  # what cannot be pickled cannot cross ZeroGPU's process boundary either
        payload = pickle.dumps(("error", RuntimeError(f"ZeroGPU could not pickle the {kind}: {exc!r}")))
    conn.send_bytes(payload)


def _child(fn: Callable, args: tuple, kwargs: dict, conn, generator: bool) -> None:
    global _HELD
    _HELD = True
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        if generator:
            for item in fn(*args, **kwargs):
                _send(conn, "item", item)
            _send(conn, "done", None)
        else:
            _send(conn, "done", fn(*args, **kwargs))
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the caller
        try:
            pickle.dumps(exc)
            err: BaseException = exc
        except Exception:
            err = RuntimeError(f"{type(exc).__name__}: {exc}")
        err.__notes__ = [traceback.format_exc()[-2000:]]  # type: ignore[attr-defined]
        _send(conn, "error", err)
    finally:
        conn.close()
        os._exit(0)  # no atexit handlers, no flushing of the parent's buffers: the worker just ends


def _run(fn: Callable, args: tuple, kwargs: dict, generator: bool):
    ctx = get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(fn, args, kwargs, child, generator), daemon=True)
    proc.start()
    child.close()
    try:
        while True:
            try:
                kind, value = pickle.loads(parent.recv_bytes())
            except EOFError:
                proc.join(5)
                raise RuntimeError(f"the ZeroGPU worker died (exit code {proc.exitcode})") from None
            if kind == "item":
                yield value
            elif kind == "done":
                if not generator:
                    yield value
                return
            else:
                raise value
    finally:
        parent.close()
        if proc.is_alive():  # the caller stopped early (a Stop press): the lease ends with it
            proc.terminate()
        proc.join(5)


def GPU(fn: Callable | None = None, *, duration: int | float | Callable = 60, **_: Any):  # noqa: N802 - spaces' name
    """``@spaces.GPU``, ``@spaces.GPU(duration=…)`` or ``spaces.GPU(fn, duration=…)``."""

    def wrap(f: Callable) -> Callable:
        if inspect.isgeneratorfunction(f):

            @functools.wraps(f)
            def gen(*args, **kwargs):
                seconds = _requested(duration, args, kwargs)
                _check_quota(seconds)
                _log(f, seconds)
                yield from _run(f, args, kwargs, generator=True)

            return gen

        @functools.wraps(f)
        def call(*args, **kwargs):
            seconds = _requested(duration, args, kwargs)
            _check_quota(seconds)
            _log(f, seconds)
            return next(_run(f, args, kwargs, generator=False))

        return call

    return wrap(fn) if fn is not None else wrap


if os.environ.get("FAKE_ZEROGPU_LOG"):  # a served app under test: every forward is watched
    import torch

    torch.nn.modules.module.register_module_forward_pre_hook(_forward_outside)
