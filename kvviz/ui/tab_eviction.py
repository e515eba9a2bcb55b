"""Eviction tab: what each registered policy keeps per layer and KV head, and what that does to the answer.

Handlers check raw widget values (``gr.Error`` says what to fix), call :mod:`kvviz.eviction.run`,
:mod:`kvviz.eviction.compare` and :mod:`kvviz.eviction.demos`, and draw with
:mod:`kvviz.figures.eviction`; no tensor math here. The named endpoint ``/evict`` returns the same
dict as ``python -m kvviz evict --json``.
"""

from __future__ import annotations

import contextlib

import gradio as gr

from kvviz.eviction.compare import compare
from kvviz.eviction.demos import (
    NEEDLE_BUDGET,
    NEEDLE_FILLER,
    SINKS_CACHE,
    SINKS_TOKENS,
    needle_demo,
    sinks_demo,
    split_question,
)
from kvviz.eviction.policies import POLICIES, check_params, field_specs, make_policy
from kvviz.eviction.run import EvictionRequest, resolve_budget
from kvviz.examples import NEEDLE_ANSWER, NEEDLE_QUESTION, needle_passage
from kvviz.figures import eviction as fig
from kvviz.safety import clean_prompt, real_number, whole_number
from kvviz.ui import eviction_compose
from kvviz.ui.context import AppContext, ShowMeAnswer
from kvviz.ui.gpu import gpu
from kvviz.ui.jobs import UserError
from kvviz.ui.play import play_button
from kvviz.ui.precompute import live_box, origin, shared
from kvviz.ui.sessions import user_errors
from kvviz.ui.widgets import captioned_plot, clear_on_refusal, waiting_table
from kvviz.units import format_bytes, plural

# what is compressed after the prefill: (what the page says, the value handlers compare)
COMPRESS_QUESTION, COMPRESS_CONTEXT = "question", "context"
COMPRESS = [
    ("with the question (it votes)", COMPRESS_QUESTION),
    ("only the context (question fed after, uncompressed)", COMPRESS_CONTEXT),
]
BUDGET_MODES = ["tokens", "ratio"]
NEEDLE_TOKENS = 512  # the needle demo's prompt (496 tokens), for its cost estimate
EMPTY = "Press **Run policy** (or a demo button) to see what the policy keeps."


def _quiet(fraction: float, desc: str = "") -> None:
    """Progress nobody watches (a stored result shown in a show-me's event)."""


def _user(fn, *args, what: str = "Eviction run"):
    """Call the library; its ValueErrors become gr.Errors, anything else a clean job-failed message."""
    with user_errors(what):  # the job dies, the app does not
        return fn(*args)


def check_request(
    ctx: AppContext, context, question, chat, policy_name, mode, budget, ratio, max_new, params: dict | None, compress
) -> EvictionRequest:
    """Everything a run needs, checked (gr.Error with what to fix before any model work)."""
    with user_errors():
        if policy_name not in POLICIES:
            raise ValueError(f"Pick a policy: {', '.join(POLICIES)}.")
        text = clean_prompt(context, ctx.settings.max_prompt_chars)
        q = "" if question is None or not str(question).strip() else clean_prompt(question, 2000)
        n_new = whole_number(max_new, "Max new tokens", 1, ctx.settings.max_new_tokens)
        if mode not in BUDGET_MODES:
            raise ValueError("Budget mode must be 'tokens' or 'ratio'.")
        b = whole_number(budget, "Budget (tokens kept)", 1, 10**6) if mode == "tokens" else None
        r = real_number(ratio, "Compression ratio", 0.0, 0.99) if mode == "ratio" else None
        policy = make_policy(policy_name, **check_params(policy_name, params))
        if compress not in (COMPRESS_QUESTION, COMPRESS_CONTEXT):
            raise ValueError(f"What is compressed must be {COMPRESS_QUESTION!r} or {COMPRESS_CONTEXT!r}.")
        context_only = compress == COMPRESS_CONTEXT
        if context_only and not q:
            raise ValueError("Compressing only the context needs a question: type one in the Question box.")
        ids, n_context = split_question(ctx.lm, text, q, bool(chat))
        limit = min(ctx.settings.max_prompt_tokens, ctx.info.context_length or 10**9)
        if len(ids) + n_new > limit:
            raise ValueError(
                f"The prompt is {len(ids):,} tokens; with {plural(n_new, 'new token')} that exceeds the limit "
                f"of {limit:,} tokens. Shorten it or generate fewer tokens."
            )
        n_c = n_context if context_only else len(ids)
        try:  # validates the policy against the budget, no model work
            resolve_budget(policy, n_c, b, r)
        except ValueError as exc:
            if r is None:
                raise
            raise ValueError(
                f"Compression ratio {r:g} evicts too much of the {n_c:,} compressed tokens: {exc} "
                "Lower the compression ratio."
            ) from None
    return EvictionRequest(ids=ids, policy=policy, budget=b, ratio=r, n_compress=n_c, max_new_tokens=n_new)


def api_evict(
    ctx: AppContext,
    prompt_text: str,
    policy_name: str = "snapkv",
    budget: int | None = None,
    ratio: float | None = None,
    chat: bool = True,
    max_new_tokens: int = 32,
    params: dict | None = None,
    question: str = "",
    compress_context_only: bool = False,
    request: gr.Request | None = None,
) -> dict:
    """The ``/evict`` endpoint: the JSON of ``python -m kvviz evict --json``; ``params`` holds the policy's own
    parameters by name (its field specs), e.g. ``{"sinks": 4}``."""
    if (budget is None) == (ratio is None):
        raise UserError("Give exactly one of budget (tokens kept) or ratio (fraction evicted).")
    req = check_request(
        ctx,
        prompt_text,
        question,
        chat,
        policy_name,
        "tokens" if budget is not None else "ratio",
        budget,
        ratio,
        max_new_tokens,
        params,
        COMPRESS_CONTEXT if compress_context_only else COMPRESS_QUESTION,
    )
    with ctx.jobs.start(request, "eviction run", len(req.ids), req.max_new_tokens) as ticket:
        result = _user(lambda: req.run(ctx.lm, record_history=False, should_stop=ticket.expired))
    out = result.summary()
    if ticket.timed_out:
        out["note"] = ctx.jobs.timeout_note(ticket).lstrip(" ·")
    return out


def status_text(run, policy) -> str:
    mode = (
        "**Positions:** kept keys keep their original RoPE positions (a kept entry's cache slot differs "
        "from its position)."
        if run.position_mode == "original"
        else "**Positions:** re-positioned as in the StreamingLLM paper: kept keys are re-rotated so their RoPE "
        "position is their cache slot, and new tokens are fed at the slot position."
    )
    compressed = (
        f"the first {run.n_compressed} of {run.n_prompt} prompt tokens (the rest was fed afterwards)"
        if run.n_compressed < run.n_prompt
        else f"all {run.n_prompt} prompt tokens"
    )
    return (
        f"**{policy.title}** compressed {compressed} to **n_kept = {run.n_kept}** entries per layer and KV "
        f"head. Cache now **{format_bytes(run.cache_bytes)}** (measured from the tensors) vs "
        f"**{format_bytes(run.full_cache_bytes)}** for the full cache. {mode}"
    )


def policy_text(name: str) -> str:
    """The chosen policy's paper, idea and score, shown beside its parameters."""
    cls = POLICIES.get(name)
    if cls is None:
        return ""
    score = f"**Score:** {cls.score_label}." if cls.score_label else "**Score:** none — position alone decides."
    return f"**{cls.title}** — *{cls.paper}*. {cls.summary} {score}"


def views(run, layer, head, step, score_label=""):
    """Strip, kept map, timeline, scores and slot table for the chosen layer, KV head and step."""
    if run is None:
        return (gr.skip(),) * 5
    step = min(int(step or 0), len(run.history) - 1)
    layer, head = int(layer or 0), int(head or 0)
    return (
        fig.token_strip(run, layer, head, step),
        fig.kept_map(run, step),
        fig.timeline(run, layer, head),
        fig.scores_figure(run, layer, head, score_label),
        fig.slot_table(run, layer, head, step),
    )


def build(ctx: AppContext) -> None:
    """Build the tab inside the caller's ``gr.Tab``."""
    info = ctx.info
    gr.Markdown(
        "Which cache entries each policy keeps, per layer and KV head, and what dropping the rest does to the "
        f"answer. The cache is stored per KV head ({info.kv_heads} per layer here, each shared by "
        f"{info.group_size} query heads), so score-based policies **average their scores over the query heads of "
        "each KV group**. The generation below really drops the entries: the cache tensors shrink."
    )
    with gr.Row():
        with gr.Column(scale=3):
            prompt = gr.Textbox(
                label="Context (compressed)", lines=6, elem_id="evict-prompt", value=needle_passage(*NEEDLE_FILLER)
            )
            question = gr.Textbox(
                label="Question (appended after a blank line; optional)",
                lines=1,
                elem_id="evict-question",
                value=f"Question: {NEEDLE_QUESTION}",
            )
            chat = gr.Checkbox(True, label="Use the chat template", elem_id="evict-chat")
            compress = gr.Radio(
                COMPRESS,
                value=COMPRESS_QUESTION,
                label="What is compressed after the prefill",
                elem_id="evict-compress",
            )
        with gr.Column(scale=2):
            policy = gr.Dropdown(
                [(cls.title, name) for name, cls in POLICIES.items()],
                value="snapkv",
                label="Policy",
                elem_id="evict-policy",
            )
            mode = gr.Radio(BUDGET_MODES, value="tokens", label="Budget as", elem_id="evict-mode")
            budget = gr.Number(
                NEEDLE_BUDGET, precision=0, label="Budget: tokens kept per layer and KV head", elem_id="evict-budget"
            )
            # plain number boxes: a slider would clamp −0.2 to 0 silently; the handler refuses it by name
            ratio = gr.Number(
                0.5, label="Compression ratio r (fraction evicted, 0 to 0.99)", elem_id="evict-ratio", visible=False
            )
            max_new = gr.Number(
                16,
                precision=0,
                label=f"Max new tokens (1 to {min(128, ctx.settings.max_new_tokens)})",
                elem_id="evict-max-new",
            )
            about = gr.Markdown(policy_text("snapkv"), elem_id="evict-policy-about")
            param_boxes, groups = {}, {}
            for name, cls in POLICIES.items():
                specs = field_specs(cls)
                with gr.Group(visible=name == "snapkv") as groups[name]:
                    if specs:
                        gr.Markdown(f"**{cls.title}** parameters")
                    for s in specs:
                        key = f"{name}.{s['name']}"
                        label = f"{s['name'].replace('_', ' ')} — {s['help']}"
                        if s["type"] == "bool":
                            param_boxes[key] = gr.Checkbox(s["default"], label=label)
                        elif s["choices"]:
                            param_boxes[key] = gr.Radio(s["choices"], value=s["default"], label=label)
                        elif s["type"] == "float":
                            param_boxes[key] = gr.Slider(s["min"], s["max"], value=s["default"], step=0.05, label=label)
                        else:
                            param_boxes[key] = gr.Number(
                                s["default"], precision=0, label=label, minimum=s["min"], maximum=s["max"]
                            )
            run_btn = gr.Button("Run policy", variant="primary", elem_id="evict-run")
    status = gr.Markdown(EMPTY, elem_id="evict-status")
    answer = gr.Textbox(label="Answer under the policy", lines=2, elem_id="evict-answer")
    with gr.Row():
        layer = gr.Slider(0, info.layers - 1, value=info.layers - 1, step=1, label="Layer", elem_id="evict-layer")
        head = gr.Dropdown(
            [
                (f"KV head {h} (query heads {h * info.group_size}–{(h + 1) * info.group_size - 1})", h)
                for h in range(info.kv_heads)
            ],
            value=0,
            label="KV head",
            elem_id="evict-head",
        )
        step = gr.Slider(
            0, 1, value=0, step=1, label="Step (0 = after the prefill, then one per fed token)", elem_id="evict-step"
        )
        play_button(step, "evict-play")
    strip = gr.HighlightedText(
        label="Tokens: kept / evicted / sink / window / heavy hitter",
        elem_id="evict-strip",
        color_map=fig.ROLE_COLORS,
        combine_adjacent=False,
        show_legend=True,
        show_inline_category=False,
    )
    gr.Markdown(fig.CAPTIONS["strip"], elem_classes="caption")
    kept_plot = gr.Plot(label="Layers × positions", elem_id="evict-map")
    gr.Markdown(fig.CAPTIONS["map"], elem_classes="caption")
    time_plot = gr.Plot(label="Over decode steps", elem_id="evict-timeline")
    gr.Markdown(fig.CAPTIONS["timeline"], elem_classes="caption")
    score_plot = gr.Plot(label="Scores behind the choice", elem_id="evict-scores")
    gr.Markdown(fig.CAPTIONS["scores"], elem_classes="caption")
    with gr.Row():
        budget_plot = captioned_plot("Budget per layer and KV head", "evict-budgets", fig.CAPTIONS["budgets"])
        with gr.Column():
            budget_table = gr.Dataframe(
                waiting_table("Press Run policy to see the bytes each store holds for the kept set"),
                label="What the kept set costs",
                elem_id="evict-budget-bytes",
            )
            gr.Markdown(fig.CAPTIONS["budget_bytes"], elem_classes="caption")
    slots = gr.Dataframe(
        waiting_table("Press Run policy to see the chosen KV head's cache, slot by slot"),
        label="The chosen KV head's cache: slot, original position, RoPE position",
        elem_id="evict-slots",
        max_height=260,
    )
    gr.Markdown(
        "Each row is one held entry: its slot in the cache tensor, the token's original position, and the "
        "position its key is rotated with (the status line above says which mode is in force).",
        elem_classes="caption",
    )

    gr.Markdown("### Side by side: full cache vs policies (same prompt, same budget)")
    with gr.Row():
        chosen = gr.CheckboxGroup(
            [(cls.title, n) for n, cls in POLICIES.items() if n != "full"],
            value=["streaming_llm", "h2o", "snapkv"],
            label="Policies to compare (default parameters; the selected policy uses yours)",
            elem_id="evict-compare-policies",
        )
        with gr.Column(scale=0, min_width=260):
            compare_btn = gr.Button("Compare", elem_id="evict-compare")
            compare_live = live_box("evict-compare-live")
    verdict = gr.Markdown(elem_id="evict-verdict")
    table = gr.Dataframe(
        waiting_table("Press Compare to see each policy's answer next to the full cache's"),
        label="Answers and agreement with the full cache",
        elem_id="evict-table",
        wrap=True,
    )
    gr.Markdown(fig.CAPTIONS["comparison"], elem_classes="caption")
    with gr.Row():
        bytes_plot = captioned_plot("Cache bytes", "evict-bytes", fig.CAPTIONS["bytes"])
        kl_plot = captioned_plot("KL per step", "evict-kl", fig.CAPTIONS["kl"])

    composition = eviction_compose.layout()

    gr.Markdown("### Demos")
    with gr.Row():
        needle_btn = gr.Button(f"Needle: who keeps the code {NEEDLE_ANSWER}?", elem_id="evict-needle")
        sinks_btn = gr.Button("Sinks matter: perplexity with and without the first 4 tokens", elem_id="evict-sinks")
    demo_live = live_box("evict-demo-live")
    gr.Markdown(
        f"**Needle** compares the full cache, StreamingLLM and SnapKV at {NEEDLE_BUDGET} kept tokens on a "
        "passage with one fact in the middle; switch *What is compressed* to see SnapKV lose the fact when "
        f"the question cannot vote. **Sinks matter** scores {SINKS_TOKENS} tokens of the chapter with a "
        f"{SINKS_CACHE}-entry cache. Both are computed once when the server starts; tick *Recompute live* to run "
        "them again now (a minute on a CPU).",
        elem_classes="caption",
    )
    sinks_md = gr.Markdown(elem_id="evict-sinks-result")
    sinks_plot = gr.Plot(label="Sinks matter", elem_id="evict-sinks-plot")
    gr.Markdown(fig.CAPTIONS["sinks"], elem_classes="caption")

    run_state = gr.State(None)
    ctx.components.update(
        {
            "eviction.prompt": prompt,
            "eviction.question": question,
            "eviction.chat": chat,
            "eviction.policy": policy,
            "eviction.mode": mode,
            "eviction.budget": budget,
            "eviction.ratio": ratio,
            "eviction.compress": compress,
            "eviction.max_new": max_new,
            "eviction.run": run_btn,
            "eviction.needle": needle_btn,
            "eviction.sinks": sinks_btn,
            "eviction.compare": compare_btn,
            "eviction.layer": layer,
            "eviction.head": head,
            "eviction.step": step,
        }
    )
    keys = list(param_boxes)
    main_inputs = [prompt, question, chat, policy, mode, budget, ratio, max_new, compress, *param_boxes.values()]
    view_outputs = [strip, kept_plot, time_plot, score_plot, slots]

    def gather(context, q, use_chat, name, md, b, r, n_new, comp, *pvals):
        values = {k.split(".", 1)[1]: v for k, v in zip(keys, pvals) if k.startswith(f"{name}.")}
        return check_request(ctx, context, q, use_chat, name, md, b, r, n_new, values, comp)

    def check(request: gr.Request, *args):
        req = gather(*args)
        ctx.jobs.hold(request, ctx.jobs.admit(request, "eviction run", len(req.ids), req.max_new_tokens))

    def run(request: gr.Request, *args):
        req = gather(*args)
        with ctx.jobs.start(request, "eviction run", len(req.ids), req.max_new_tokens) as ticket:
            result = _user(lambda: req.run(ctx.lm, should_stop=ticket.expired))
        return (
            result,
            status_text(result, req.policy),
            result.text,
            gr.Slider(minimum=0, maximum=max(1, len(result.history) - 1), value=0),
            *views(result, info.layers - 1, 0, 0, req.policy.score_label),
            fig.budget_map(result),
            fig.budget_bytes(result),
        )

    run_outputs = [run_state, status, answer, step, *view_outputs, budget_plot, budget_table]
    checked = run_btn.click(check, main_inputs, None, api_name=False, show_progress="hidden", concurrency_limit=None)
    clear_on_refusal(checked, [status, run_state, answer, *view_outputs])
    clear_on_refusal(
        checked.success(gpu(run), main_inputs, run_outputs, api_name=False, concurrency_limit=None),
        [status, run_state, answer, *view_outputs],
    )

    def redraw(result, lyr, hd, st):
        label = POLICIES[result.policy].score_label if result is not None else ""
        return views(result, lyr, hd, st, label)

    for control in (layer, head, step):
        control.change(redraw, [run_state, layer, head, step], view_outputs, api_name=False, show_progress="hidden")
    policy.change(
        lambda n: [gr.Group(visible=n == name) for name in groups] + [policy_text(n)],
        policy,
        [*groups.values(), about],
        api_name=False,
        queue=False,
    )
    mode.change(
        lambda m: (gr.Number(visible=m == "tokens"), gr.Number(visible=m == "ratio")),
        mode,
        [budget, ratio],
        api_name=False,
        queue=False,
    )

    def comparison_outputs(cmp, found: dict | None = None):
        text = f"Full cache answered: *{cmp.full.text.strip()}*"
        if found is not None:
            text = " · ".join(
                f"**{POLICIES[n].title}**: {'found' if ok else 'lost'} {NEEDLE_ANSWER}" for n, ok in found.items()
            )
        return text, fig.comparison_table(cmp), fig.bytes_figure(cmp), fig.kl_figure(cmp)

    def compare_request(names, *args):
        req = gather(*args)
        if not names:
            raise UserError("Tick at least one policy to compare with the full cache.")
        pols = [req.policy if n == req.policy.name else make_policy(n) for n in names if n in POLICIES]
        for p in pols:
            _user(resolve_budget, p, req.n_compress, req.budget, req.ratio)
        return req, pols

    def check_compare(request: gr.Request, names, *args):
        req, pols = compare_request(names, *args)
        ctx.jobs.hold(
            request, ctx.jobs.admit(request, "comparison", len(req.ids), req.max_new_tokens, runs=len(pols) + 1)
        )

    def compare_key(req, pols) -> tuple:
        return (
            ctx.lm.name,
            "compare",
            tuple(req.ids),
            tuple(repr(p) for p in pols),
            req.budget,
            req.ratio,
            req.n_compress,
            req.max_new_tokens,
        )

    def compare_job(req, pols):
        def compute(report, should_stop):
            return _user(
                lambda: compare(
                    ctx.lm,
                    req.ids,
                    pols,
                    budget=req.budget,
                    ratio=req.ratio,
                    n_compress=req.n_compress,
                    max_new_tokens=req.max_new_tokens,
                    progress=report,
                    should_stop=should_stop,
                ),
                what="Comparison",
            )

        return compute

    def run_compare(request: gr.Request, progress=gr.Progress(), *args):  # Gradio injects both
        live, *args = args
        req, pols = compare_request(*args)
        cmp, entry = shared(
            ctx,
            request,
            compare_key(req, pols),
            compare_job(req, pols),
            live=bool(live),
            what="comparison",
            cost=(len(req.ids), req.max_new_tokens),
            runs=len(pols) + 1,
            progress=lambda f, d: progress(f, desc=d),
        )
        text, *rest = comparison_outputs(cmp)
        return (f"{text} · *{origin(entry)}{'; tokens/s measured then' if entry else ''}*", *rest)

    def plan_compare(names, *args) -> None:
        """The comparison the tab opens with (the needle passage, three policies): ready before a click."""
        req, pols = compare_request(names, *args)
        ctx.store.plan(compare_key(req, pols), "eviction comparison", compare_job(req, pols))

    compared = compare_btn.click(
        check_compare, [chosen, *main_inputs], None, api_name=False, show_progress="hidden", concurrency_limit=None
    )
    clear_on_refusal(compared, [verdict, table, bytes_plot, kl_plot])
    clear_on_refusal(
        compared.success(
            gpu(run_compare),
            [compare_live, chosen, *main_inputs],
            [verdict, table, bytes_plot, kl_plot],
            api_name=False,
            concurrency_limit=None,
        ),
        [verdict, table, bytes_plot, kl_plot],
    )
    # a deployment whose limits refuse the tab's opening settings computes the comparison on a click instead
    with contextlib.suppress(UserError, gr.Error):
        plan_compare(chosen.value, *[c.value for c in main_inputs])

    eviction_compose.wire(ctx, composition, main_inputs, gather)

    def needle_key(comp) -> tuple:
        return ctx.lm.name, "needle", comp != COMPRESS_CONTEXT

    def needle_job(comp):
        def compute(report, should_stop):
            return _user(
                lambda: needle_demo(ctx.lm, compress_question=comp != COMPRESS_CONTEXT, progress=report),
                what="Needle demo",
            )

        return compute

    def plan_needle(values: dict) -> tuple:
        comp = values.get("eviction.compress", compress.value)
        ctx.store.plan(needle_key(comp), "needle demo", needle_job(comp))
        return needle_key(comp)

    ctx.planners["eviction.needle"] = plan_needle
    plan_needle({})

    def run_needle(comp, live, request: gr.Request, progress=gr.Progress()):
        res, entry = shared(
            ctx,
            request,
            needle_key(comp),
            needle_job(comp),
            live=bool(live),
            what="needle demo",
            cost=(NEEDLE_TOKENS, 16),
            runs=3,
            progress=lambda f, d: progress(f, desc=d),
        )
        snap = next(r for r in res.comparison.results if r.policy.name == "snapkv")
        run = snap.run
        text, *rest = comparison_outputs(res.comparison, res.found())
        return (
            needle_passage(*NEEDLE_FILLER),
            f"Question: {NEEDLE_QUESTION}",
            True,
            "snapkv",
            "tokens",
            NEEDLE_BUDGET,
            run,
            status_text(run, snap.policy),
            run.text,
            gr.Slider(minimum=0, maximum=max(1, len(run.history) - 1), value=0),
            *views(run, info.layers - 1, 0, 0, snap.policy.score_label),
            f"{text} · *{origin(entry)}{'; tokens/s measured then' if entry else ''}*",
            *rest,
        )

    def stored_needle(request: gr.Request, comp, live):
        """The needle demo's outputs when its result is stored (for a show-me), else None."""
        entry = ctx.store.entry(needle_key(comp))
        return (
            run_needle(comp, False, request, progress=_quiet) if entry is not None and entry.state == "done" else None
        )

    needle_outputs = [
        prompt,
        question,
        chat,
        policy,
        mode,
        budget,
        run_state,
        status,
        answer,
        step,
        *view_outputs,
        verdict,
        table,
        bytes_plot,
        kl_plot,
    ]
    ctx.answers["eviction.needle"] = ShowMeAnswer([compress, demo_live], needle_outputs, stored_needle)
    needle_btn.click(gpu(run_needle), [compress, demo_live], needle_outputs, api_name=False, concurrency_limit=None)

    def sinks_job(report, should_stop):
        return _user(lambda: sinks_demo(ctx.lm, progress=report), what="Sinks demo")

    ctx.store.plan((ctx.lm.name, "sinks"), "sinks demo", sinks_job)
    ctx.planners["eviction.sinks"] = lambda values: (ctx.lm.name, "sinks")

    def run_sinks(live, request: gr.Request, progress=gr.Progress()):
        res, entry = shared(
            ctx,
            request,
            (ctx.lm.name, "sinks"),
            sinks_job,
            live=bool(live),
            what="sinks demo",
            cost=(SINKS_CACHE, SINKS_TOKENS - SINKS_CACHE),
            runs=3,
            window=SINKS_CACHE,
            progress=lambda f, d: progress(f, desc=d),
        )
        ppl = " · ".join(f"{name}: **{v:.1f}**" for name, v in res.perplexity.items())
        return (
            f"Perplexity after the cache first fills (position > {res.cache_size}): {ppl} · *{origin(entry)}*",
            fig.sinks_figure(res),
        )

    sinks_btn.click(gpu(run_sinks), [demo_live], [sinks_md, sinks_plot], api_name=False, concurrency_limit=None)

    def evict(
        prompt_text: str,
        policy_name: str = "snapkv",
        budget: int | None = None,
        ratio: float | None = None,
        chat: bool = True,
        max_new_tokens: int = 32,
        params: dict | None = None,
        question: str = "",
        compress_context_only: bool = False,
        request: gr.Request = None,
    ) -> dict:
        """Generate under an eviction policy; ``params``: the policy's parameters by name, e.g. {"sinks": 4}."""
        return api_evict(
            ctx,
            prompt_text,
            policy_name,
            budget,
            ratio,
            chat,
            max_new_tokens,
            params,
            question,
            compress_context_only,
            request,
        )

    gr.api(gpu(evict), api_name="evict", concurrency_limit=None)
