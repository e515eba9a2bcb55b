"""One wrapper for every handler that runs the shared model: validation first, then the gate, the GPU lease,
progress, Stop and user errors — in that order, here and nowhere else.

A tab declares a :class:`ModelJob`: what it is, how its raw inputs are checked (``check(ctx, *inputs)``
returns the request; no model work, no slot), what the request costs (``size(request)``, for the gate's
estimate and the GPU lease) and how it runs (``run(job)``: call kvviz, format the outputs). Then it wires
it: :meth:`ModelJob.button` (a quick check step, then the run step), :meth:`ModelJob.event` (one step) or
:meth:`ModelJob.api` (a named endpoint whose parameters are the check function's own signature). Tests
call a declaration directly: ``job(ctx, *inputs)``.

A button's check step only validates and asks the gates whether they would refuse now
(:meth:`~kvviz.ui.serving.jobs.Jobs.precheck`); it never takes a place in line, so a client that sends
only checks — private steps are still callable by ``fn_index`` — holds nothing. The slot is taken when the
run step starts and released in ``finally`` (by the worker thread of a streaming job, once the model has
stopped), and by the gate itself should a job outlive its time budget (:data:`kvviz.admission.REAP_AFTER`).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import gradio as gr

from kvviz import openmp
from kvviz.admission import Lease
from kvviz.capture.model_io import encode_prompt
from kvviz.limits import GPU_LEASE_CEILING_S, check_prompt_length, job_cost, lease_seconds, prompt_limit
from kvviz.safety import clean_prompt
from kvviz.ui.serving.context import AppContext
from kvviz.ui.serving.gpu import gpu, spaces_available
from kvviz.ui.serving.job import Job, Size
from kvviz.ui.serving.jobs import UserError
from kvviz.ui.serving.sessions import user_errors

R = TypeVar("R")
# every step Gradio calls for a model job carries this attribute: its ModelJob (tests list them)
MARK = "model_job"
# how each step is registered: no Gradio concurrency group (the gates are the model's queues) and, for a
# button's check, nothing to call through the client libraries
STEP = {"api_name": False, "concurrency_limit": None}


@dataclass(frozen=True)
class ModelJob(Generic[R]):
    """A handler that runs the model, declared once (see the module docstring).

    ``run`` may be a generator (a streaming job): it then takes its slot itself with :meth:`Job.turns`.
    ``store``: the run looks in the shared store first and takes its slot itself (:meth:`Job.slot`, e.g.
    through :func:`kvviz.ui.serving.precompute.shared`) only when it must compute. ``failed`` names the
    job in the message when it dies mid-way ("Eviction run failed: …"). ``stop``: the session's Stop
    button ends it. ``progress``: Gradio's progress bar is passed in (:meth:`Job.progress`).
    """

    what: str
    check: Callable[..., R]
    run: Callable[[Job[R]], Any]
    size: Callable[[R], Size]
    room: bool = False
    store: bool = False
    failed: str | None = None
    stop: bool = False
    progress: bool = False
    waiting: Callable[[str], Any] | None = None  # a streaming job's output while it waits for its turn (ZeroGPU)

    def __call__(self, ctx: AppContext, *inputs, request=None, progress=None, check: Callable[..., R] | None = None):
        """Check the inputs, then run through the gate: every wiring below calls this."""
        return self.start(ctx, (check or self.check)(ctx, *inputs), request, progress)

    def start(self, ctx: AppContext, req: R, request=None, progress=None):
        """Run an already checked request through the gate (its slot released whatever happens)."""
        job = Job(ctx, self, req, request, progress)
        if inspect.isgeneratorfunction(self.run):
            return self._stream(job)
        return self._call(job)

    def _call(self, job: Job[R]):
        try:
            with user_errors(self.failed or self.what.capitalize()):
                if not self.store:
                    job.slot()
                return self.run(job)
        finally:
            job.close()
            openmp.release()  # a handler's thread computes no more: its OpenMP workers would slow the engine's

    def _stream(self, job: Job[R]) -> Iterator:
        try:
            with user_errors(self.failed or self.what.capitalize()):
                for item in self.run(job):
                    openmp.release()  # Gradio runs each step in a worker thread of its pool: hand back its workers
                    yield item
        finally:
            job.close()
            openmp.release()

    def with_(self, **changes) -> ModelJob[R]:
        """The same job with other parts (an endpoint's own check and run beside the tab's)."""
        return dataclasses.replace(self, **changes)

    # ---- the GPU lease ------------------------------------------------------------------------------
    def lease(self, ctx: AppContext, check: Callable[..., R], inputs: tuple) -> int:
        """Seconds of GPU this call asks for, from its own cost estimate (the floor for a request that will
        be refused: it ends before any model work)."""
        ceiling = min(ctx.settings.max_job_seconds, GPU_LEASE_CEILING_S)
        try:
            s = self.size(check(ctx, *inputs))
        except Exception:
            return lease_seconds(job_cost(0, 0, 1, 0), ceiling)
        info = ctx.info
        cost = job_cost(
            s.prompt_tokens, s.new_tokens, info.layers, info.kv_bytes_per_token, s.runs, s.window, s.repeat_passes
        )
        return lease_seconds(cost, ceiling)

    # ---- Gradio steps -------------------------------------------------------------------------------
    def handler(
        self,
        ctx: AppContext,
        check: Callable[..., R] | None = None,
        name: str | None = None,
        outputs: list | None = None,
    ) -> Callable:
        """The run step as Gradio calls it, ``fn(request, [progress,] *inputs)``, inside its GPU lease. A run that
        returns (or yields) ``{component: value}`` is handed back as plain values in ``outputs``' order: components
        do not cross ZeroGPU's process boundary (a result is pickled back), their values do."""
        check = check or self.check
        zero = self.leased(ctx, check, outputs) if spaces_available() else None
        if zero is not None and inspect.isgeneratorfunction(self.run):

            def fn(request: gr.Request, *inputs):
                yield from zero(request, None, *inputs)

        elif zero is not None and self.progress:

            def fn(request: gr.Request, progress=gr.Progress(), *inputs):  # noqa: B008 — Gradio injects it
                return zero(request, progress, *inputs)

        elif zero is not None:

            def fn(request: gr.Request, *inputs):
                return zero(request, None, *inputs)

        elif inspect.isgeneratorfunction(self.run):

            def fn(request: gr.Request, *inputs):
                for item in self(ctx, *inputs, request=request, check=check):
                    yield _plain(item, outputs)

        elif self.progress:

            def fn(request: gr.Request, progress=gr.Progress(), *inputs):  # noqa: B008 — Gradio injects it
                return _plain(self(ctx, *inputs, request=request, progress=_bar(progress), check=check), outputs)

        else:

            def fn(request: gr.Request, *inputs):
                return _plain(self(ctx, *inputs, request=request, check=check), outputs)

        fn.__name__ = fn.__qualname__ = name or getattr(self.run, "__name__", "run")
        setattr(fn, MARK, self)
        return fn

    # ---- ZeroGPU: admitted here, the model in the GPU call ------------------------------------------
    def leased(self, ctx: AppContext, check: Callable[..., R], outputs: list | None = None) -> Callable:
        """``call(request, progress, *inputs)`` on ZeroGPU: checked, admitted and waited for in the main process (whose
        gates see every job), then one ``spaces.GPU`` call with this job's duration rebuilds the job from the same
        inputs in the worker and runs it under a :class:`~kvviz.admission.Lease` of the main ticket."""
        what = self.failed or self.what.capitalize()

        def main_job(request, progress, inputs) -> Job[R]:
            return Job(ctx, self, check(ctx, *inputs), request, None if progress is None else _bar(progress))

        def gpu_job(lease: Lease, request, progress, inputs) -> Job[R]:
            return Job(ctx, self, check(ctx, *inputs), request, None if progress is None else _bar(progress), lease)

        if inspect.isgeneratorfunction(self.run):

            def in_gpu_stream(lease: Lease, request, *inputs):
                for item in self._stream(gpu_job(lease, request, None, inputs)):
                    yield _plain(item, outputs)  # values, not components, cross back from the worker

            stream = gpu(in_gpu_stream, duration=lambda _lease, _request, *inputs: self.lease(ctx, check, inputs))

            def main_stream(request, _progress, *inputs):
                job = main_job(request, None, inputs)
                try:
                    with user_errors(what):
                        for line in job.turns():
                            if self.waiting is not None:
                                yield self.waiting(line)
                    if job.stopped:
                        if self.waiting is not None:
                            yield self.waiting("Stopped before it started: the run left the queue.")
                        return
                    yield from stream(Lease.of(job.waited()), request, *inputs)
                except UserError as exc:
                    _count(ctx, exc)
                    raise
                finally:
                    job.close()

            return main_stream

        def in_gpu(lease: Lease, request, progress, *inputs):
            return _plain(self._call(gpu_job(lease, request, progress, inputs)), outputs)

        call = gpu(in_gpu, duration=lambda _lease, _request, _progress, *inputs: self.lease(ctx, check, inputs))

        def main_call(request, progress, *inputs):
            job = main_job(request, progress, inputs)
            try:
                with user_errors(what):
                    ticket = job.waited()
                return call(Lease.of(ticket), request, progress, *inputs)
            except UserError as exc:
                _count(ctx, exc)
                raise
            finally:
                job.close()

        return main_call

    def checker(self, ctx: AppContext, check: Callable[..., R] | None = None) -> Callable:
        """A button's check step: the inputs checked and the gates asked, nothing taken (see :meth:`Jobs.precheck`);
        returns the checked request, which :meth:`button` hands to the run step."""
        check = check or self.check

        def fn(request: gr.Request, *inputs) -> R:
            req = check(ctx, *inputs)
            s = self.size(req)
            ctx.jobs.precheck(
                request, s.prompt_tokens, s.new_tokens, s.runs, s.window, room=self.room, repeat_passes=s.repeat_passes
            )
            return req

        fn.__name__ = fn.__qualname__ = f"check_{getattr(self.run, '__name__', 'run')}"
        setattr(fn, MARK, self)
        return fn

    def button(self, ctx: AppContext, trigger, inputs, outputs: list, **run_options):
        """``trigger.click(check).success(run)``: bad input (or a refusal) is answered by a quick step with no
        visible outputs, so its message is a toast and the previous results stay. The check builds the request
        once per click and the run step is handed it (a per-session ``gr.State`` only the check writes), so
        the inputs are never read or checked twice. Returns (check event, run event)."""
        request = gr.State(None)
        checked = trigger.click(self.checker(ctx), inputs, request, show_progress="hidden", **STEP)
        ran = checked.success(self.handler(ctx, check=handed, outputs=outputs), request, outputs, **STEP, **run_options)
        return checked, ran

    def event(self, ctx: AppContext, triggers, inputs: list | None, outputs: list, **run_options):
        """One step on ``triggers`` (an event listener such as ``button.click``, or a list of them)."""
        listeners = triggers if isinstance(triggers, list) else [triggers]
        return gr.on(listeners, self.handler(ctx, outputs=outputs), inputs, outputs, **STEP, **run_options)

    def api(self, ctx: AppContext, api_name: str, returns: type = dict) -> None:
        """A named endpoint: its parameters, name and docstring are the check function's own (less ``ctx``)."""
        gr.api(endpoint(ctx, self.check, self, returns), api_name=api_name, concurrency_limit=None)


def handed(ctx: AppContext, req):
    """The run step's "check": the request its check step built (None only for a step called on its own)."""
    if req is None:
        raise gr.Error("Press the button again: this request was not checked.")
    return req


def prompt_ids(ctx: AppContext, prompt, chat, new_tokens: int = 0, which: str = "The prompt") -> tuple[str, list[int]]:
    """A raw prompt cleaned (:func:`kvviz.safety.clean_prompt`) and tokenized, within the deployment's prompt
    limit with ``new_tokens`` more (:func:`kvviz.limits.check_prompt_length`): the one prompt check."""
    with user_errors():
        text = clean_prompt(prompt, ctx.settings.max_prompt_chars)
        ids = encode_prompt(ctx.lm, text, bool(chat))
        check_prompt_length(
            len(ids), new_tokens, prompt_limit(ctx.settings.max_prompt_tokens, ctx.info.context_length), which
        )
    return text, ids


def endpoint(ctx: AppContext, fn: Callable, job: ModelJob | None = None, returns: type = dict) -> Callable:
    """``fn(ctx, …)`` as a Gradio endpoint with ``fn``'s own signature less ``ctx`` (plus the request):
    ``job`` given, ``fn`` is its check and the call runs the job; else ``fn`` is called itself (arithmetic)."""
    signature = inspect.signature(fn)
    params = list(signature.parameters.values())[1:]
    if job is not None:
        params.append(inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None))
    shown = signature.replace(parameters=params, return_annotation=returns)

    zero = job.leased(ctx, fn) if job is not None and spaces_available() else None

    def call(*args, **kwargs):
        bound = shown.bind(*args, **kwargs)
        bound.apply_defaults()
        values = dict(bound.arguments)
        if job is None:
            return fn(ctx, *values.values())
        request = values.pop("request")
        if zero is not None:
            return zero(request, None, *values.values())
        return job(ctx, *values.values(), request=request, check=fn)

    functools.update_wrapper(call, fn)
    call.__signature__ = shown  # type: ignore[attr-defined]
    hints = {k: v for k, v in fn.__annotations__.items() if k not in ("ctx", "return")}
    call.__annotations__ = {**hints, **({"request": gr.Request} if job is not None else {}), "return": returns}
    if job is not None:
        setattr(call, MARK, job)
    return call


def _count(ctx: AppContext, exc: UserError) -> None:
    """A ZeroGPU refusal (its ``reason`` set by :func:`~kvviz.ui.serving.gpu.gpu`) counted for /metrics."""
    if (reason := getattr(exc, "reason", None)) is not None:
        ctx.jobs.refusals.count(reason)


def _plain(result, outputs: list | None):
    """``{component: value}`` as a list of values in ``outputs``' order (unnamed ones left as they are)."""
    if outputs is None or not isinstance(result, dict) or not result:
        return result
    if not all(isinstance(c, gr.components.Component) for c in result):
        return result
    values = [result.get(c, gr.skip()) for c in outputs]
    return values if len(outputs) > 1 else values[0]


def _bar(progress: gr.Progress) -> Callable[[float, str], None]:
    return lambda fraction, desc="": progress(fraction, desc=desc)
