"""The Eviction tab's one policy run: its request checked from raw widget values, its status line and its views.

Shared by the tab's sections (:mod:`kvviz.ui.eviction.tab`, :mod:`kvviz.ui.eviction.compare`,
:mod:`kvviz.ui.eviction.demos`) and the ``/evict`` endpoint; no tensor math here.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvviz.eviction.demos import split_question
from kvviz.eviction.policies import POLICIES, check_params, make_policy
from kvviz.eviction.reconstruction import repeat_passes
from kvviz.eviction.run import EvictionRequest, resolve_budget
from kvviz.figures import eviction as fig
from kvviz.limits import MAX_BUDGET_TOKENS, MAX_QUESTION_CHARS, check_prompt_length, prompt_limit
from kvviz.safety import clean_prompt, real_number, whole_number
from kvviz.ui.serving.context import AppContext
from kvviz.ui.serving.job import Job, Size
from kvviz.ui.serving.jobs import UserError
from kvviz.ui.serving.model_job import ModelJob
from kvviz.ui.serving.sessions import user_errors

# what is compressed after the prefill: (what the page says, the value handlers compare)
COMPRESS_QUESTION, COMPRESS_CONTEXT = "question", "context"
COMPRESS = [
    ("with the question (it votes)", COMPRESS_QUESTION),
    ("only the context (question fed after, uncompressed)", COMPRESS_CONTEXT),
]
BUDGET_MODES = ["tokens", "ratio"]
NEEDLE_TOKENS = 512  # the needle demo's prompt (496 tokens), for its cost estimate
EMPTY = "Press **Run policy** (or a demo button) to see what the policy keeps."


def library_call(fn, *args, what: str = "Eviction run"):
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
        q = "" if question is None or not str(question).strip() else clean_prompt(question, MAX_QUESTION_CHARS)
        n_new = whole_number(max_new, "Max new tokens", 1, ctx.settings.max_new_tokens)
        if mode not in BUDGET_MODES:
            raise ValueError("Budget mode must be 'tokens' or 'ratio'.")
        b = whole_number(budget, "Budget (tokens kept)", 1, MAX_BUDGET_TOKENS) if mode == "tokens" else None
        r = real_number(ratio, "Compression ratio", 0.0, 0.99) if mode == "ratio" else None
        policy = make_policy(policy_name, **check_params(policy_name, params))
        if compress not in (COMPRESS_QUESTION, COMPRESS_CONTEXT):
            raise ValueError(f"What is compressed must be {COMPRESS_QUESTION!r} or {COMPRESS_CONTEXT!r}.")
        context_only = compress == COMPRESS_CONTEXT
        if context_only and not q:
            raise ValueError("Compressing only the context needs a question: type one in the Question box.")
        ids, n_context = split_question(ctx.lm, text, q, bool(chat))
        check_prompt_length(len(ids), n_new, prompt_limit(ctx.settings.max_prompt_tokens, ctx.info.context_length))
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
    passes = policy_passes(ctx, ids[:n_c], [policy])
    return EvictionRequest(ids, policy, b, r, n_c, n_new, passes)


def policy_passes(ctx: AppContext, compressed: list[int], policies) -> tuple[tuple[int, int], ...]:
    """The repeat passes (KVzip's reconstruction of the context) ``policies`` make over the compressed prompt."""
    out: tuple[tuple[int, int], ...] = ()
    for p in policies:
        repeat = p.reconstruction_pass
        if repeat is not None:
            out += library_call(repeat_passes, ctx.lm.tokenizer, compressed, repeat[1])
    return out


def request_size(req: EvictionRequest) -> Size:
    """One policy run: its prompt and new tokens, and KVzip's repeat of the context."""
    return Size(len(req.ids), req.max_new_tokens, repeat_passes=req.repeat_passes)


def evict(
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
) -> EvictionRequest:
    """Generate under an eviction policy and compare with the full cache (answer, top-1 agreement, KL, bytes).

    Args:
        prompt_text: the prompt (the context to compress), plain text.
        policy_name: the eviction policy, e.g. streaming_llm, h2o, snapkv, knorm, tova, pyramidkv, adakv.
        budget: cache entries kept per layer and KV head, in tokens (give this or ratio, not both).
        ratio: fraction of the compressed tokens evicted, from 0 to 0.99 (give this or budget, not both).
        chat: true wraps the prompt (and question) in the model's chat template.
        max_new_tokens: tokens to generate after the compression, a whole number from 1 to KVVIZ_MAX_NEW_TOKENS.
        params: the policy's own parameters by name, e.g. {"sinks": 4} for streaming_llm (omitted: its defaults).
        question: an optional question asked after the context (plain text; empty for none).
        compress_context_only: true compresses only the context and keeps the question whole (needs a question).

    Returns:
        The run's summary: the answer, the full cache's answer, agreement, KL, bytes kept and tokens/s.
    """
    if (budget is None) == (ratio is None):
        raise UserError("Give exactly one of budget (tokens kept) or ratio (fraction evicted).")
    return check_request(
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


def evict_summary(job: Job[EvictionRequest]) -> dict:
    """The JSON of ``python -m kvviz evict --json`` for a checked request."""
    out = job.req.run(job.ctx.lm, record_history=False, should_stop=job.cancel).summary()
    if job.timed_out:
        out["note"] = job.timeout_note().lstrip(" ·")
    return out


# the ``/evict`` endpoint (and ``api_evict(ctx, prompt_text, …)`` in tests)
api_evict = ModelJob("eviction run", check=evict, run=evict_summary, size=request_size)


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
    return f"**{policy.title}** compressed {compressed} to {fig.kept_sentence(run)}. {fig.bytes_sentence(run)} {mode}"


def compress_choices(name: str) -> list[tuple[str, str]]:
    """The *What is compressed* choices for policy ``name``: the question votes only for policies that read queries."""
    if name not in POLICIES or make_policy(name).reads_queries:
        return COMPRESS
    title = POLICIES[name].title.split(" (")[0]  # "KVzip", not its parenthesised gloss
    return [
        (
            f"with the question (compressed like the context: {title} never reads its queries, so it does not vote)",
            COMPRESS_QUESTION,
        ),
        COMPRESS[1],
    ]


def policy_text(name: str) -> str:
    """The chosen policy's paper, idea and score, shown beside its parameters."""
    cls = POLICIES.get(name)
    if cls is None:
        return ""
    score = f"**Score:** {cls.score_label}." if cls.score_label else "**Score:** none — position alone decides."
    return f"**{cls.title}** — *{cls.paper}*. {cls.summary} {score}"


@dataclass(frozen=True)
class RunViews:
    """A policy run drawn for one layer, KV head and step, by the name of the tab's view each goes to."""

    strip: list
    kept_plot: object
    time_plot: object
    score_plot: object
    slots: object


def views(run, layer, head, step, score_label="") -> RunViews | None:
    """Strip, kept map, timeline, scores and slot table for the chosen layer, KV head and step (None: no run)."""
    if run is None:
        return None
    step = min(int(step or 0), len(run.history) - 1)
    layer, head = int(layer or 0), int(head or 0)
    return RunViews(
        fig.token_strip(run, layer, head, step),
        fig.kept_map(run, step),
        fig.timeline(run, layer, head),
        fig.scores_figure(run, layer, head, score_label),
        fig.slot_table(run, layer, head, step),
    )
