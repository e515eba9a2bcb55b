"""Generate tab: type a prompt, watch tokens stream while the cache grows, check cached == recompute."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import gradio as gr

from kvviz.capture.loop import Sampling, encode_prompt
from kvviz.capture.tokens import token_texts
from kvviz.examples import GENERATE_EXAMPLE, examples
from kvviz.figures import generate as fig
from kvviz.memory.capacity import max_context
from kvviz.memory.layout import cache_layout
from kvviz.safety import clean_prompt, real_number, whole_number
from kvviz.ui.generate.stream import STATUS_S, LiveRun, mark, replay_range
from kvviz.ui.page.play import play_button
from kvviz.ui.serving.context import AppContext
from kvviz.ui.serving.gpu import gpu
from kvviz.ui.serving.jobs import UserError
from kvviz.ui.serving.precompute import live_box, origin, share_trace
from kvviz.ui.serving.sessions import job_failed, user_errors
from kvviz.ui.serving.streaming import Background, Snapshot
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


def validate_request(
    ctx: AppContext, prompt: str, chat: bool, max_new_tokens: float, temperature: float, top_p: float, seed: float
) -> tuple[list[int], int, Sampling]:
    """Turn raw inputs into checked values, or raise gr.Error with what to fix (before any model work)."""
    with user_errors():  # every input checked by kvviz.safety: NaN, fractions, text, control characters
        text = clean_prompt(prompt, ctx.settings.max_prompt_chars)
        n_new = whole_number(max_new_tokens, "Max new tokens", 1, ctx.settings.max_new_tokens)
        sampling = Sampling(
            real_number(0.0 if temperature is None else temperature, "Temperature", 0.0, 5.0),
            real_number(1.0 if top_p is None else top_p, "Top-p", 0.0, 1.0, lo_open=True),
            whole_number(0 if seed is None else seed, "Seed", 0, 2**32 - 1),
        )
        sampling.validate()
    ids = encode_prompt(ctx.lm, text, bool(chat))
    limit = min(ctx.settings.max_prompt_tokens, ctx.info.context_length or 10**9)
    if len(ids) + n_new > limit:
        raise UserError(
            f"The prompt is {len(ids):,} tokens; with {plural(n_new, 'new token')} that exceeds the limit of "
            f"{limit:,} tokens. Shorten the prompt or generate fewer tokens."
        )
    return ids, n_new, sampling


def room_for_tokens(lm, budget_bytes: float | None, weight_bytes: int) -> int | None:
    """Cached tokens that fit beside the weights, by the memory module (windows and MLA included)."""
    if not budget_bytes:
        return None
    layout = cache_layout(lm.config)
    bytes_per_element = lm.model.dtype.itemsize
    return max_context(layout, int(max(budget_bytes - weight_bytes, 0)), kv_dtype=bytes_per_element)


def build(ctx: AppContext):
    """Build the tab; returns the Generate event so the app can chain other tabs' refreshes after it."""
    ex = examples()
    gr.Markdown(
        "Type a prompt and press **Generate**. The model is "
        f"**{ctx.info.name}**; every layer's keys and values are captured as it writes."
    )
    with gr.Row():
        with gr.Column(scale=3):
            prompt = gr.Textbox(label="Prompt", lines=4, value=ex[GENERATE_EXAMPLE][0], elem_id="prompt")
            example = gr.Dropdown(list(ex), label="Examples", value=GENERATE_EXAMPLE)
        with gr.Column(scale=2):
            chat = gr.Checkbox(value=True, label="Use the chat template")
            max_new = gr.Slider(1, ctx.settings.max_new_tokens, value=48, step=1, label="Max new tokens")
            with gr.Accordion("Sampling", open=False):
                temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="Temperature (0 = greedy)")
                top_p = gr.Slider(0.05, 1.0, value=1.0, step=0.05, label="Top-p")
                seed = gr.Number(value=0, precision=0, label="Seed")
            budget = gr.Dropdown(list(GPU_BUDGETS), value="T4 (16 GB)", label="GPU budget for the gauge")
            with gr.Row():
                go_btn = gr.Button("Generate", variant="primary", elem_id="generate-btn")
                stop_btn = gr.Button("Stop", variant="stop", elem_id="stop-btn")
            fresh = live_box("generate-live")
    status = gr.Markdown(elem_id="gen-status")
    tokens = gr.HighlightedText(
        label="Tokens (prompt / generated)",
        elem_id="token-stream",
        color_map={"prompt": "#cfe2ff", "generated": "#ffd8a8"},
        combine_adjacent=False,
        show_legend=True,
        show_inline_category=False,
    )
    answer = gr.Textbox(label="Generated text", lines=3, elem_id="answer")
    with gr.Row(equal_height=True):
        step = gr.Slider(0, 1, value=0, step=1, label="Replay: decode step (0 = prefill)", elem_id="gen-step")
        play_button(step, "gen-play")
    with gr.Row():
        with gr.Column():
            growth = gr.Plot(label="Cache growth", elem_id="cache-growth")
            gr.Markdown(fig.CAPTIONS["growth"])
        with gr.Column():
            gauge = gr.Plot(label="Memory gauge", elem_id="memory-gauge")
            gr.Markdown(fig.CAPTIONS["gauge"])
    gr.Markdown(fig.model_card(ctx.info), elem_id="model-card")
    check = gr.Markdown(elem_id="equivalence")
    waste = gr.Markdown(elem_id="waste")
    with gr.Row():
        download_npz = gr.File(label="Trace (.npz)", interactive=False)
        download_csv = gr.File(label="Steps (.csv)", interactive=False)

    ctx.components.update(
        {
            "generate.prompt": prompt,
            "generate.chat": chat,
            "generate.max_new": max_new,
            "generate.example": example,
            "generate.button": go_btn,
            "generate.step": step,
        }
    )
    example.change(lambda name: (ex[name][0], ex[name][1]), example, [prompt, chat], queue=False, api_name=False)

    def submit(text, use_chat, ids, n_new, sampling, should_stop):
        """A checked Generate request to the engine, with the equivalence check, as the tab and /generate run it."""
        return ctx.engine.submit(
            text,
            chat=bool(use_chat),
            max_new_tokens=n_new,
            sampling=sampling,
            prompt_ids=ids,
            verify=True,
            should_stop=should_stop,
        )

    def gen_key(ids, n_new, sampling) -> tuple:
        return ctx.lm.name, "generate", tuple(ids), n_new, sampling.temperature, sampling.top_p, sampling.seed

    def plan(values: dict) -> tuple:
        """A show-me's generation, planned so it is ready before the click (greedy, as the tab opens)."""
        text, use_chat = values.get("generate.prompt", prompt.value), values.get("generate.chat", chat.value)
        ids, n_new, sampling = validate_request(
            ctx,
            text,
            use_chat,
            values.get("generate.max_new", max_new.value),
            temperature.value,
            top_p.value,
            seed.value,
        )

        def compute(report, should_stop):
            handle = submit(text, use_chat, ids, n_new, sampling, should_stop)
            trace = None
            for trace in handle.stream():
                report(trace.n_generated / n_new, f"{plural(trace.n_generated, 'token')}")
            if trace is not None and not should_stop():
                share_trace(ctx, trace)
            return trace, _export_bytes(trace)

        key = gen_key(ids, n_new, sampling)
        ctx.store.plan(key, f"generation of {plural(n_new, 'token')}", compute)
        return key

    ctx.planners["generate.button"] = plan

    def stored_run(entry, budget_name, request):
        """Serve a stored generation: wait while it is being prepared, then the final outputs at once."""
        while entry.state == "running":
            entry.wait(0.5)
            yield (
                gr.skip(),
                f"Being prepared at start-up: {100 * entry.fraction:.0f} % ({entry.desc})",
                *[gr.skip()] * (len(outputs) - 2),
            )
        if entry.state == "done":
            trace, files = entry.value
            live = LiveRun(
                ctx.info,
                budget_name,
                GPU_BUDGETS.get(budget_name),
                room_for_tokens(ctx.lm, GPU_BUDGETS.get(budget_name), ctx.info.weight_bytes),
                token_texts(ctx.lm.tokenizer, trace.token_ids[: trace.n_prompt]),
                export=lambda _trace: _write_files(files, ctx.session_dir(request)),
            )
            snap = Snapshot(item=trace, mark=None, progress=None, items=1, done=True)
            yield (*live.outputs(snap, note=f" · {origin(entry)}"), replay_range(snap))

    def run(prompt_text, use_chat, n_new, temp, p, sd, budget_name, fresh_run, request: gr.Request):
        ids, n_new, sampling = validate_request(ctx, prompt_text, use_chat, n_new, temp, p, sd)
        entry = None if fresh_run else ctx.store.entry(gen_key(ids, n_new, sampling))
        if entry is not None and entry.state != "pending":
            held = ctx.jobs.take(request)
            if held is not None:
                held.release()
            yield from stored_run(entry, budget_name, request)
            if entry.state == "done":
                return
        mine = False
        ticket = ctx.jobs.take(request) or ctx.jobs.admit(request, "generation", len(ids), n_new, runs=2, room=True)
        flag = ctx.stop_flag(request)
        flag.clear()
        job = None
        try:  # a fault, Stop, the time budget or a disconnect ends this job only; the cache goes with it
            for line in ctx.jobs.turns(ticket):
                if flag.is_set():
                    yield (
                        gr.skip(),
                        "Stopped before it started: the run left the queue.",
                        *[gr.skip()] * (len(outputs) - 2),
                    )
                    return
                yield (gr.skip(), line, *[gr.skip()] * (len(outputs) - 2))
            budget = GPU_BUDGETS.get(budget_name)
            live = LiveRun(
                ctx.info,
                budget_name,
                budget,
                room_for_tokens(ctx.lm, budget, ctx.info.weight_bytes),
                token_texts(ctx.lm.tokenizer, ids),
                export=lambda trace: _export(trace, ctx.session_dir(request)),
            )

            if entry is not None:  # a planned generation nobody started yet: this run computes it for all
                entry, mine = ctx.store.claim(entry.key)

            def work(report):
                handle = submit(
                    prompt_text,
                    use_chat,
                    ids,
                    n_new,
                    sampling,
                    lambda: flag.is_set() or ticket.expired() or job.cancelled,
                )
                t0, trace = time.perf_counter(), None
                for trace in handle.stream(report):
                    if mine and entry is not None:
                        entry.report(trace.n_generated / n_new, plural(trace.n_generated, "token"))
                    yield trace
                done = trace is not None and trace.stop_reason != "stopped" and not ticket.timed_out
                if mine and entry is not None and done:
                    share_trace(ctx, trace)
                    ctx.store.fulfil(entry, (trace, _export_bytes(trace)), "a request", time.perf_counter() - t0)

            # the model runs in its own thread and releases the ticket there when it has stopped; this
            # generator only renders the latest state at the page's pace
            job = Background(work, mark=mark, on_exit=[ticket.release], name="kvviz-generate")
            job.start()
            for snap in job.snapshots(STATUS_S):
                yield (*live.outputs(snap, note=ctx.jobs.timeout_note(ticket)), replay_range(snap))
        except gr.Error:
            raise
        except Exception as exc:
            raise gr.Error(job_failed(exc), print_exception=False) from None
        finally:
            if job is not None and job.started:
                job.cancel()  # a page that went away: the worker stops at its next step
            else:
                ticket.release()
            ctx.forget_session(request)
            if mine and entry is not None and entry.state == "running":
                ctx.store.fail(entry)

    outputs = [ctx.trace_state, status, tokens, answer, growth, gauge, check, waste, download_npz, download_csv, step]

    def check(prompt_text, use_chat, n_new, temp, p, sd, request: gr.Request):
        ids, n_new, _ = validate_request(ctx, prompt_text, use_chat, n_new, temp, p, sd)
        ctx.jobs.hold(request, ctx.jobs.admit(request, "generation", len(ids), n_new, runs=2, room=True))

    # bad input (and a refused admission) is answered by a quick step with no outputs, so its message is
    # a toast and the previous run's results stay visible; the run step waits its turn at the gate. Its
    # progress shows on the status line only: Gradio's full progress pulses every output while a run
    # streams, and on a small machine those animations take CPU from the model
    event = go_btn.click(
        check,
        [prompt, chat, max_new, temperature, top_p, seed],
        None,
        api_name=False,
        concurrency_limit=None,
        show_progress="hidden",
    ).success(
        gpu(run),
        [prompt, chat, max_new, temperature, top_p, seed, budget, fresh],
        outputs,
        api_name=False,
        concurrency_limit=None,
        show_progress="minimal",
        show_progress_on=[status],
    )

    def stop(request: gr.Request):
        ctx.stop_flag(request).set()

    stop_btn.click(stop, None, None, queue=False, api_name=False)
    step.change(replay, [ctx.trace_state, step], [tokens, growth], api_name=False, show_progress="hidden")

    def api_generate(
        prompt_text: str,
        max_new_tokens: int = 48,
        chat: bool = True,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int = 0,
        request: gr.Request = None,
    ) -> dict:
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
        ids, n_new, sampling = validate_request(ctx, prompt_text, chat, max_new_tokens, temperature, top_p, seed)
        with ctx.jobs.admit(request, "generation", len(ids), n_new, runs=2, room=True) as ticket:
            ticket.wait()
            try:
                trace = submit(prompt_text, chat, ids, n_new, sampling, ticket.expired).result()
            except Exception as exc:
                raise gr.Error(job_failed(exc), print_exception=False) from None
        out = trace.summary()
        if ticket.timed_out:
            out["note"] = ctx.jobs.timeout_note(ticket).lstrip(" ·")
        return out

    gr.api(gpu(api_generate), api_name="generate", concurrency_limit=None)

    def api_engine() -> dict:
        """The engine's counters (runs submitted and shared, forwards, largest batch) and its prefix
        cache (blocks, bytes held, hit rate): what the room's requests shared."""
        return ctx.engine.snapshot()

    gr.api(api_engine, api_name="engine", queue=False)
    return event


def replay(trace, step):
    """The token strip and cache growth as they were after decode step ``step`` of the session's run."""
    if trace is None:
        return gr.skip(), gr.skip()
    with user_errors():
        upto = whole_number(step or 0, "Step", 0, 10**9)
    return fig.token_spans(trace, upto), fig.cache_growth(trace, upto=upto)


def _export(trace, folder: Path) -> tuple[str, str]:
    """Write this session's trace and step table to its own temporary folder (per run, deleted with the session)."""
    npz = trace.save(folder / "kvviz-trace.npz")
    csv = folder / "kvviz-steps.csv"
    trace.step_frame().to_csv(csv, index=False)
    return str(npz), str(csv)


def _export_bytes(trace) -> dict[str, bytes]:
    """The two export files of a stored run, as bytes (written once; each session gets a copy)."""
    with tempfile.TemporaryDirectory() as tmp:
        return {Path(p).name: Path(p).read_bytes() for p in _export(trace, Path(tmp))}


def _write_files(files: dict[str, bytes], folder: Path) -> tuple[str, str]:
    """Copy a stored run's export files into this session's folder."""
    paths = []
    for name, data in files.items():
        (folder / name).write_bytes(data)
        paths.append(str(folder / name))
    return paths[0], paths[1]
