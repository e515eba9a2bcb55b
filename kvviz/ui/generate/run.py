"""The Generate tab's model jobs: the checked request, the streamed run through the engine's room, a stored
(show-me) run, and the ``/generate`` endpoint.

:data:`generation` streams: the model runs in a worker (:meth:`~kvviz.ui.serving.model_job.Job.background`)
and the handler renders its latest state at the page's pace (:mod:`kvviz.ui.generate.stream`).
:data:`api_generate` is the same job answering once, with the trace summary.
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

import gradio as gr

from kvviz.cancel import Cancel
from kvviz.capture.model_io import Sampling
from kvviz.capture.tokens import token_texts
from kvviz.chat.history import MODEL
from kvviz.limits import MAX_SEED
from kvviz.memory.capacity import max_context
from kvviz.memory.layout import cache_layout
from kvviz.safety import temperature as checked_temperature
from kvviz.safety import top_p as checked_top_p
from kvviz.safety import whole_number
from kvviz.ui.generate.chat import api_turn, chat_ids, history_of
from kvviz.ui.generate.stream import STATUS_S, LiveRun, finished, mark, replay_range
from kvviz.ui.generate.views import Form, Frame, Views
from kvviz.ui.serving.context import AppContext
from kvviz.ui.serving.identity import session_of
from kvviz.ui.serving.job import Job, Size
from kvviz.ui.serving.model_job import ModelJob, prompt_ids
from kvviz.ui.serving.precompute import origin, share_trace
from kvviz.ui.serving.sessions import user_errors
from kvviz.ui.serving.streaming import Snapshot
from kvviz.units import plural

GPU_BUDGETS = {
    "none": None,
    "T4 (16 GB)": 16e9,
    "L4 (24 GB)": 24e9,
    "RTX 4090 (24 GB)": 24e9,
    "A100 (80 GB)": 80e9,
    "H100 (80 GB)": 80e9,
    "H200 (141 GB)": 141e9,
}


@dataclass(frozen=True)
class Ask:
    """A checked Generate request, and how the tab shows it (the gauge's budget, "Recompute live")."""

    text: str
    chat: bool
    ids: list[int]
    n_new: int
    sampling: Sampling
    budget_name: str = "none"
    fresh: bool = True
    history: tuple = ()  # a chat turn: the earlier messages, checked ({role, content} each)
    template: str = MODEL
    keep_turn: bool = False  # a chat turn: its prompt and answer stay in the prefix store for the next one


def validate_request(
    ctx: AppContext, prompt: str, chat: bool, max_new_tokens: float, temperature: float, top_p: float, seed: float
) -> tuple[list[int], int, Sampling]:
    """Turn raw inputs into checked values, or raise gr.Error with what to fix (before any model work)."""
    with user_errors():  # every input checked by kvviz.safety: NaN, fractions, text, control characters
        n_new = whole_number(max_new_tokens, "Max new tokens", 1, ctx.settings.max_new_tokens)
        sampling = Sampling(
            checked_temperature(temperature),
            checked_top_p(top_p),
            whole_number(0 if seed is None else seed, "Seed", 0, MAX_SEED),
        )
        sampling.validate()
    return prompt_ids(ctx, prompt, chat, n_new)[1], n_new, sampling


def ask(ctx: AppContext, form: Form) -> Ask:
    """The tab's inputs, checked; ``multi``: the next turn of the session's ``conversation`` through ``template``."""
    f = form
    ids, n_new, sampling = validate_request(ctx, f.prompt, f.chat, f.max_new, f.temperature, f.top_p, f.seed)
    if not f.multi:
        return Ask(str(f.prompt), bool(f.chat), ids, n_new, sampling, str(f.budget), bool(f.fresh))
    return chat_turn(ctx, f.prompt, f.chat, n_new, sampling, history_of(f.conversation), f.template, str(f.budget))


def chat_turn(ctx: AppContext, prompt, chat, n_new, sampling, history, template, budget_name="none") -> Ask:
    """A chat turn's request: the conversation so far and the new message through ``template``."""
    if not chat:
        raise gr.Error("A multi-turn chat runs through a chat template: turn on “Use the chat template”.")
    text = prompt_ids(ctx, prompt, False)[0]
    turns, ids = chat_ids(ctx, text, history, template, n_new)
    return Ask(text, True, ids, n_new, sampling, budget_name, True, tuple(turns), str(template), True)


def api_generate(
    ctx: AppContext,
    prompt_text: str,
    max_new_tokens: int = 48,
    chat: bool = True,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
) -> Ask:
    """Generate with the captured model and return the trace summary (JSON): the text, every step's cache
    bytes, and the equivalence check (cached decoding against full recomputation).

    Args:
        prompt_text: the prompt, plain text (at most KVVIZ_MAX_PROMPT_TOKENS tokens).
        max_new_tokens: tokens to generate, a whole number from 1 to KVVIZ_MAX_NEW_TOKENS.
        chat: true wraps the prompt in the model's chat template (as one user message), false feeds it as is.
        temperature: sampling temperature; 0 decodes greedily (the same answer every time).
        top_p: nucleus sampling, the probability mass kept (0 < top_p ≤ 1; 1 keeps every token).
        seed: random seed for sampling (a whole number); equal requests give equal answers.

    Returns:
        The trace summary: text, tokens, per-step cache bytes, stop reason and the max |Δ logit| check.
    """
    return ask(ctx, Form(prompt_text, chat, max_new_tokens, temperature, top_p, seed, budget="none", fresh=True))


def api_chat(
    ctx: AppContext,
    prompt_text: str,
    max_new_tokens: int = 48,
    chat: bool = True,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
    history: str = "[]",
    template: str = MODEL,
) -> Ask:
    """One turn of a chat: generate as /generate does, the prompt being the conversation so far plus this
    message; the turn's prompt and answer stay in the prefix cache, so the next turn starts from them.

    Args:
        prompt_text: this turn's message, plain text.
        max_new_tokens: tokens to generate, a whole number from 1 to KVVIZ_MAX_NEW_TOKENS.
        chat: must be true (a chat runs through a chat template).
        temperature: sampling temperature; 0 decodes greedily (the same answer every time).
        top_p: nucleus sampling, the probability mass kept (0 < top_p ≤ 1; 1 keeps every token).
        seed: random seed for sampling (a whole number); equal requests give equal answers.
        history: the earlier messages as a JSON list of {"role": "user" | "assistant", "content": text}, user
            first, ending with an answer ("[]" starts a chat; at most 64 messages, 256 KiB of JSON).
        template: "model" (the model's own chat template) or "drop-answers" (the same with earlier answers
            left out, a template that rewrites history).

    Returns:
        The trace summary, and "turn": prompt tokens reused from the cache and computed, and the first position
        where the prompt differs from the previous turn's tokens, with the text around it.
    """
    _, n_new, sampling = validate_request(ctx, prompt_text, chat, max_new_tokens, temperature, top_p, seed)
    return chat_turn(ctx, prompt_text, chat, n_new, sampling, history, template)


def submit(ctx: AppContext, a: Ask, cancel: Cancel | Callable[[], bool], owner: str | None = None):
    """A checked Generate request to the engine, with the equivalence check, as the tab and /generate run it
    (``owner``: the session that sent it, whose prefix blocks other sessions may not read; None for the
    server's own show-me runs)."""
    return ctx.engine.submit(
        a.text,
        owner=owner,
        chat=a.chat,
        max_new_tokens=a.n_new,
        sampling=a.sampling,
        prompt_ids=a.ids,
        verify=True,
        cancel=cancel,
        keep_turn=a.keep_turn,
    )


def gen_key(ctx: AppContext, a: Ask) -> tuple:
    s = a.sampling
    return ctx.lm.name, "generate", tuple(a.ids), a.n_new, s.temperature, s.top_p, s.seed


def form_of(values: dict) -> Form:
    """A show-me's values (``"generate.<field>"``) over the tab's opening ones."""
    names = {f"generate.{f.name}": f.name for f in fields(Form)}
    return Form(**{names[k]: v for k, v in values.items() if k in names})


def plan(ctx: AppContext, values: dict) -> tuple:
    """A show-me's generation, planned so it is ready before the click (greedy, as the tab opens)."""
    a = ask(ctx, form_of(values))

    def compute(report, should_stop):
        handle = submit(ctx, a, should_stop)
        trace = None
        for trace in handle.stream():
            report(trace.n_generated / a.n_new, f"{plural(trace.n_generated, 'token')}")
        if trace is not None and not should_stop():
            share_trace(ctx, trace)
        return trace, export_bytes(trace)

    def restored(value) -> None:
        """A stored generation read back from disk: shared at once, its views drawn in the background."""
        ctx.store.share(value[0])
        threading.Thread(target=share_trace, args=(ctx, value[0]), name="kvviz-draw", daemon=True).start()

    key = gen_key(ctx, a)
    ctx.store.plan(key, f"generation of {plural(a.n_new, 'token')}", compute, restored=restored)
    return key


def room_for_tokens(lm, budget_bytes: float | None, weight_bytes: int) -> int | None:
    """Cached tokens that fit beside the weights, by the memory module (windows and MLA included)."""
    if not budget_bytes:
        return None
    layout = cache_layout(lm.config)
    bytes_per_element = lm.model.dtype.itemsize
    return max_context(layout, int(max(budget_bytes - weight_bytes, 0)), kv_dtype=bytes_per_element)


def frame_of(ctx: AppContext, budget_name: str) -> Frame:
    """The charts' constants for a run measured against the GPU budget ``budget_name`` (a gauge choice)."""
    budget = GPU_BUDGETS.get(budget_name)
    return Frame(ctx.info, budget_name.split(" (")[0], budget, room_for_tokens(ctx.lm, budget, ctx.info.weight_bytes))


def _live(ctx: AppContext, views: Views, a: Ask, prompt_ids_: list[int], export) -> LiveRun:
    frame = frame_of(ctx, a.budget_name)
    return LiveRun(views, frame, token_texts(ctx.lm.tokenizer, prompt_ids_), export=export)


def _shown(live: LiveRun, snap: Snapshot, note: str) -> dict:
    """A snapshot's updates, with the replay slider's range once the run is done."""
    out = live.outputs(snap, note=note)
    slider = replay_range(snap)
    if slider is not None:
        out[live.views.step] = slider
    return out


def stored(ctx: AppContext, views: Views, a: Ask, entry, request):
    """Serve a stored generation: wait while it is being prepared (saying how far it got), then every view
    of it at once."""
    while entry.state == "running":
        entry.wait(0.5)
        yield {views.status: f"Being prepared at start-up: {100 * entry.fraction:.0f} % ({entry.desc})"}
    if entry.state == "done":
        trace, files = entry.value
        folder = ctx.session_dir(request)
        live = _live(ctx, views, a, trace.token_ids[: trace.n_prompt], lambda _t: write_files(files, folder))
        snap = Snapshot(item=trace, mark=None, progress=None, items=1, done=True)
        yield _shown(live, snap, f" · {origin(entry)}")
        yield live.files(trace)


def tab_job(views: Views) -> ModelJob[Ask]:
    """The tab's Generate button: the request read by name from ``views`` (once, by the check step), the run
    shown there."""

    def check(ctx: AppContext, values: dict) -> Ask:
        return ask(ctx, views.form(values))

    def run(job: Job[Ask]):
        yield from streamed(job, views)

    # on ZeroGPU the job waits its turn in the main process: only the status line changes meanwhile
    return generation.with_(check=check, run=run, waiting=lambda line: {views.status: line})


def streamed(job: Job[Ask], views: Views):
    """The tab's run: a stored result if there is one, else its place in the room, then the run streamed."""
    ctx, a = job.ctx, job.req
    entry = None if a.fresh or a.keep_turn else ctx.store.entry(gen_key(ctx, a))
    if entry is not None and entry.state != "pending":
        yield from stored(ctx, views, a, entry, job.request)
        if entry.state == "done":
            return
    mine = False
    try:  # a fault, Stop, the time budget or a disconnect ends this job only; the cache goes with it
        for line in job.turns():
            if job.stopped:
                yield {views.status: "Stopped before it started: the run left the queue."}
                return
            yield {views.status: line}
        live = _live(ctx, views, a, a.ids, lambda trace: export(trace, ctx.session_dir(job.request)))
        if entry is not None:  # a planned generation nobody started yet: this run computes it for all
            entry, mine = ctx.store.claim(entry.key)

        def work(report):
            handle = submit(ctx, a, job.cancel, session_of(job.request))
            t0, trace = time.perf_counter(), None
            for trace in handle.stream(report):
                if mine and entry is not None:
                    entry.report(trace.n_generated / a.n_new, plural(trace.n_generated, "token"))
                yield trace
            done = trace is not None and trace.stop_reason != "stopped" and not job.timed_out
            if mine and entry is not None and done:
                share_trace(ctx, trace)
                ctx.store.fulfil(entry, (trace, export_bytes(trace)), "a request", time.perf_counter() - t0)

        # the model runs in its own thread and releases the slot there when it has stopped; this generator
        # only renders the latest state at the page's pace
        snap = None
        for snap in job.background(work, mark=mark, name="kvviz-generate").snapshots(STATUS_S):
            yield _shown(live, snap, job.timeout_note())
        if snap is not None and finished(snap):
            yield live.files(snap.item)  # after the end is on the page (see kvviz.ui.generate.stream)
    finally:
        if mine and entry is not None and entry.state == "running":
            ctx.store.fail(entry)


def summary(job: Job[Ask]) -> dict:
    """``/generate``'s answer: the trace summary, and a note when the time budget ended the run."""
    owner = session_of(job.request)
    trace = submit(job.ctx, job.req, job.cancel, owner).result()
    out = trace.summary()
    if job.req.keep_turn:
        out["turn"] = api_turn(job.ctx, trace, list(job.req.history), job.req.template, owner)
    if job.timed_out:
        out["note"] = job.timeout_note().lstrip(" ·")
    return out


def _size(a: Ask) -> Size:
    return Size(len(a.ids), a.n_new, runs=2)  # the run and its check against a full recompute


# a Generate run: the tab's (:func:`tab_job`, streamed into its views) and the endpoints' (answered once)
generation = ModelJob("generation", check=ask, run=summary, size=_size, room=True, stop=True)
# the ``/generate`` endpoint (and ``api_generate_job(ctx, prompt_text, …)`` in tests)
api_generate_job = generation.with_(check=api_generate, stop=False)
api_chat_job = generation.with_(check=api_chat, stop=False)  # the ``/chat`` endpoint


def export(trace, folder: Path) -> tuple[str, str]:
    """Write this session's trace and step table to its own temporary folder (per run, deleted with the session)."""
    npz = trace.save(folder / "kvviz-trace.npz")
    csv = folder / "kvviz-steps.csv"
    trace.step_frame().to_csv(csv, index=False)
    return str(npz), str(csv)


def export_bytes(trace) -> dict[str, bytes]:
    """The two export files of a stored run, as bytes (written once; each session gets a copy)."""
    with tempfile.TemporaryDirectory() as tmp:
        return {Path(p).name: Path(p).read_bytes() for p in export(trace, Path(tmp))}


def write_files(files: dict[str, bytes], folder: Path) -> tuple[str, str]:
    """Copy a stored run's export files into this session's folder."""
    paths = []
    for name, data in files.items():
        (folder / name).write_bytes(data)
        paths.append(str(folder / name))
    return paths[0], paths[1]
