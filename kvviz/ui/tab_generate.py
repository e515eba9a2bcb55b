"""Generate tab: type a prompt, watch tokens stream while the cache grows, check cached == recompute."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import gradio as gr

from kvviz.capture.loop import Sampling, capture_iter, encode_prompt
from kvviz.examples import examples
from kvviz.figures import generate as fig
from kvviz.lessons.waste import forward_passes
from kvviz.memory.capacity import max_context
from kvviz.memory.layout import cache_layout
from kvviz.safety import clean_prompt, real_number, whole_number
from kvviz.ui.context import AppContext
from kvviz.ui.gpu import gpu
from kvviz.ui.jobs import UserError
from kvviz.ui.precompute import live_box, origin, share_trace
from kvviz.ui.sessions import job_failed, user_errors
from kvviz.units import format_bytes, plural

GPU_BUDGETS = {
    "none": None,
    "T4 (16 GB)": 16e9,
    "L4 (24 GB)": 24e9,
    "RTX 4090 (24 GB)": 24e9,
    "A100 (80 GB)": 80e9,
    "H100 (80 GB)": 80e9,
    "H200 (141 GB)": 141e9,
}
REFRESH_S = 0.25  # redraw charts at most this often while streaming


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


def waste_text(trace) -> str:
    """The chapter's waste counter for this run, and why its formula gives a larger number than the loop's count."""
    length, n = trace.n_prompt, trace.n_generated
    fp = forward_passes(length, n)
    one = (
        " With one generated token there is nothing to re-run yet: both loops make the same single pass over "
        "the prompt."
        if n == 1
        else ""
    )
    return (
        f"**Token-forward passes for this run** ({length} prompt + {plural(n, 'generated token')}): "
        f"with the cache **{fp.with_cache:,}** (the prompt once, then each new token but the last), without it "
        f"**{fp.without_cache:,}** (step i re-runs all {length} + i tokens, i = 0 … {n - 1}) — "
        f"**{fp.ratio:,.1f}×** the work.{one}\n\n"
        f"**Exact count vs the chapter's formula.** The count above is what a loop feeds: "
        f"{length} + ({length} + 1) + … + ({length} + {n - 1}) = NL + N(N − 1)/2 = {fp.without_cache:,}. "
        f"The chapter writes the sum over t = L … L + N, which has one more term: a pass over all "
        f"{length} + {n} = {length + n} tokens, which no loop needs (the last token is never fed back). "
        f"That sum is {fp.chapter_without_cache:,} = {fp.without_cache:,} + {fp.chapter_extra:,}, which the "
        "chapter rounds to NL + N²/2; for long runs the extra term is negligible, for short ones it dominates "
        "the gap."
    )


def build(ctx: AppContext):
    """Build the tab; returns the Generate event so the app can chain other tabs' refreshes after it."""
    ex = examples()
    gr.Markdown(
        "Type a prompt and press **Generate**. The model is "
        f"**{ctx.info.name}**; every layer's keys and values are captured as it writes."
    )
    with gr.Row():
        with gr.Column(scale=3):
            prompt = gr.Textbox(label="Prompt", lines=4, value=ex["Chat question"][0], elem_id="prompt")
            example = gr.Dropdown(list(ex), label="Examples", value="Chat question")
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
        }
    )
    example.change(lambda name: (ex[name][0], ex[name][1]), example, [prompt, chat], queue=False, api_name=False)

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
            trace = None
            for trace in capture_iter(
                ctx.lm,
                text,
                chat=bool(use_chat),
                max_new_tokens=n_new,
                sampling=sampling,
                prompt_ids=ids,
                verify=True,
                should_stop=should_stop,
            ):
                report(trace.n_generated / n_new, f"{plural(trace.n_generated, 'token')}")
            if trace is not None and not should_stop():
                share_trace(ctx, trace)
            return trace, _export_bytes(trace)

        key = gen_key(ids, n_new, sampling)
        ctx.store.plan(key, f"generation of {plural(n_new, 'token')}", compute)
        return key

    ctx.planners["generate.button"] = plan

    def ready(entry, budget_name, request):
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
            yield _outputs(trace, budget_name, final=True, request=request, note=f" · {origin(entry)}", files=files)

    def run(prompt_text, use_chat, n_new, temp, p, sd, budget_name, live, request: gr.Request):
        ids, n_new, sampling = validate_request(ctx, prompt_text, use_chat, n_new, temp, p, sd)
        entry = None if live else ctx.store.entry(gen_key(ids, n_new, sampling))
        if entry is not None and entry.state != "pending":
            held = ctx.jobs.take(request)
            if held is not None:
                held.release()
            yield from ready(entry, budget_name, request)
            if entry.state == "done":
                return
        ticket = ctx.jobs.take(request) or ctx.jobs.admit(request, "generation", len(ids), n_new, runs=2)
        flag = ctx.stop_flag(request)
        flag.clear()
        last = 0.0
        trace = None
        mine = False
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
            if entry is not None:  # a planned generation nobody started yet: this run computes it for all
                entry, mine = ctx.store.claim(entry.key)
            t0 = time.perf_counter()
            for trace in capture_iter(
                ctx.lm,
                prompt_text,
                chat=bool(use_chat),
                max_new_tokens=n_new,
                sampling=sampling,
                prompt_ids=ids,
                verify=True,
                should_stop=lambda: flag.is_set() or ticket.expired(),
            ):
                if mine and entry is not None:
                    entry.report(trace.n_generated / n_new, plural(trace.n_generated, "token"))
                now = time.perf_counter()
                if now - last < REFRESH_S and not trace.stop_reason:
                    continue
                last = now
                final = bool(trace.stop_reason) and trace.colsum is not None
                if final:  # the model's work is done: free the session's place before the page shows "Done"
                    ticket.release()
                    if mine and entry is not None and trace.stop_reason != "stopped" and not ticket.timed_out:
                        share_trace(ctx, trace)
                        ctx.store.fulfil(entry, (trace, _export_bytes(trace)), "a request", now - t0)
                yield _outputs(trace, budget_name, final=final, request=request, note=ctx.jobs.timeout_note(ticket))
        except gr.Error:
            raise
        except Exception as exc:
            raise gr.Error(job_failed(exc), print_exception=False) from None
        finally:
            ticket.release()
            ctx.forget_session(request)
            if mine and entry is not None and entry.state == "running":
                ctx.store.fail(entry)

    def _outputs(trace, budget_name, final, request=None, note="", files=None):
        msg = (
            f"{'Done' if final else 'Generating'}: {plural(trace.n_generated, 'token')}, cache "
            f"{format_bytes(trace.cache_bytes)} ({trace.steps[-1].cache_lens[0]} tokens in layer 0)"
        )
        if final:
            msg += f" · stop: {trace.stop_reason} · {trace.timings.get('decode_tokens_per_s') or 0:.1f} tokens/s{note}"
        if not final:
            files = (None, None)
        elif files is not None:  # a stored run: its files written once, copied into this session's folder
            files = _write_files(files, ctx.session_dir(request))
        else:
            files = _export(trace, ctx.session_dir(request))
        return (
            trace if final else gr.skip(),
            msg,
            fig.token_spans(trace),
            trace.text,
            fig.cache_growth(trace),
            fig.memory_gauge(
                trace.cache_bytes,
                ctx.info.weight_bytes,
                GPU_BUDGETS.get(budget_name),
                budget_name.split(" (")[0],
                room_for_tokens(ctx.lm, GPU_BUDGETS.get(budget_name), ctx.info.weight_bytes),
            ),
            fig.equivalence_text(trace) if final else "Cached vs full recompute: checked when generation ends.",
            waste_text(trace),
            *files,
        )

    outputs = [ctx.trace_state, status, tokens, answer, growth, gauge, check, waste, download_npz, download_csv]

    def check(prompt_text, use_chat, n_new, temp, p, sd, request: gr.Request):
        ids, n_new, _ = validate_request(ctx, prompt_text, use_chat, n_new, temp, p, sd)
        ctx.jobs.hold(request, ctx.jobs.admit(request, "generation", len(ids), n_new, runs=2))

    # bad input (and a refused admission) is answered by a quick step with no outputs, so its message is
    # a toast and the previous run's results stay visible; the run step waits its turn at the gate
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
    )

    def stop(request: gr.Request):
        ctx.stop_flag(request).set()

    stop_btn.click(stop, None, None, queue=False, api_name=False)

    def api_generate(
        prompt_text: str,
        max_new_tokens: int = 48,
        chat: bool = True,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int = 0,
        request: gr.Request = None,
    ) -> dict:
        """Generate with the captured model and return the trace summary (JSON)."""
        ids, n_new, sampling = validate_request(ctx, prompt_text, chat, max_new_tokens, temperature, top_p, seed)
        with ctx.jobs.admit(request, "generation", len(ids), n_new, runs=2) as ticket:
            ticket.wait()
            try:
                *_, trace = capture_iter(
                    ctx.lm,
                    prompt_text,
                    chat=bool(chat),
                    max_new_tokens=n_new,
                    sampling=sampling,
                    prompt_ids=ids,
                    verify=True,
                    should_stop=ticket.expired,
                )
            except Exception as exc:
                raise gr.Error(job_failed(exc), print_exception=False) from None
        out = trace.summary()
        if ticket.timed_out:
            out["note"] = ctx.jobs.timeout_note(ticket).lstrip(" ·")
        return out

    gr.api(gpu(api_generate), api_name="generate", concurrency_limit=None)
    return event


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


def _export(trace, folder: Path) -> tuple[str, str]:
    """Write this session's trace and step table to its own temporary folder (per run, deleted with the session)."""
    npz = trace.save(folder / "kvviz-trace.npz")
    csv = folder / "kvviz-steps.csv"
    trace.step_frame().to_csv(csv, index=False)
    return str(npz), str(csv)
