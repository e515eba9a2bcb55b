"""The Learn tab's "check your understanding" questions, each answer *computed* from kvviz's own library
(the memory calculator, the eviction policies, the real model), never typed in, so the page and the
tests check the chapter's numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from kvviz.capture.trace import EQUIVALENCE_TOLERANCE
from kvviz.examples import needle_prompt
from kvviz.lessons.guesses import Guess
from kvviz.memory.capacity import decode_step, kv_budget, max_sequences
from kvviz.memory.estimate import estimate
from kvviz.memory.layout import cache_layout
from kvviz.models import LoadedModel
from kvviz.units import format_bytes


@dataclass(frozen=True)
class Answer:
    """A computed answer: markdown for the page, the numbers for the tests."""

    text: str
    values: dict


@dataclass(frozen=True)
class Question:
    question: str
    chapter_answer: str
    compute: Callable[[LoadedModel | None], Answer]
    needs_model: bool = False
    guess: Guess | None = None  # asked before the answer is revealed


# ---- computed answers ---------------------------------------------------------------------------------
def llama3_8b_per_token(lm: LoadedModel | None = None) -> Answer:
    layout = cache_layout("Llama-3-8B")
    bf16 = estimate(layout, context=1, kv_dtype="bf16").bytes_per_token
    fp8 = estimate(layout, context=1, kv_dtype="fp8").bytes_per_token
    return Answer(
        f"From the Llama-3-8B preset ({layout.num_layers} layers, {layout.num_key_value_heads} KV heads, "
        f"head dim {layout.head_dim}): 2 × {layout.num_layers} × {layout.num_key_value_heads} × "
        f"{layout.head_dim} × 2 B = **{bf16:,} bytes = {format_bytes(bf16)}** per token in BF16, "
        f"**{format_bytes(fp8)}** ({fp8:,} bytes) in FP8.",
        {"bf16_bytes": bf16, "fp8_bytes": fp8},
    )


def why_no_query_cache(lm: LoadedModel | None) -> Answer:
    if lm is None:
        raise ValueError("This answer is measured on the loaded model.")
    from kvviz.capture.loop import capture

    trace = capture(lm, "Once upon a time", chat=False, max_new_tokens=8, verify=True)
    eq = trace.equivalence or {}
    tol, dtype = eq.get("tolerance", EQUIVALENCE_TOLERANCE), eq.get("dtype", "float32")
    same = eq["max_abs_logit_diff"] < tol
    return Answer(
        f"kvviz just generated {trace.n_generated} tokens keeping only keys and values — no query was "
        f"ever stored — and a full recomputation {'agrees' if same else 'DISAGREES'}: largest logit difference "
        f"**{eq['max_abs_logit_diff']:.1e}** over {eq['positions_checked']} positions ({dtype} rounding "
        f"allows {tol:.1e}), the same greedy token at {eq.get('top1_agree', '?')} of them. Each step computes "
        "one query per head for the new token and uses it once.",
        {
            "max_abs_logit_diff": eq["max_abs_logit_diff"],
            "positions": eq["positions_checked"],
            "tolerance": tol,
            "dtype": dtype,
            "top1_agree": eq.get("top1_agree"),
        },
    )


def doubling_the_batch(lm: LoadedModel | None = None, batch: int = 162, context: int = 8192) -> Answer:
    layout = cache_layout("Llama-3-70B")
    weights = 140 * 10**9
    budget = kv_budget(8, 80, weights, 0.1).kv_budget_bytes  # the chapter's 8 × H100: 436 GB ≈ 406 GiB
    one = decode_step(weights, estimate(layout, context, batch).total_bytes, 3.35, gpus=8)
    two = decode_step(weights, estimate(layout, context, 2 * batch).total_bytes, 3.35, gpus=8)
    fits = (one.kv_bytes <= budget, two.kv_bytes <= budget)
    most = max_sequences(layout, budget, context)
    caveat = (
        f" But {2 * batch} sequences no longer fit: {format_bytes(two.kv_bytes)} of KV is more than the "
        f"{format_bytes(budget)} budget these GPUs leave (at most {most} sequences at {context:,} tokens), so "
        "the doubled batch needs more GPUs or a smaller (FP8) cache."
        if not fits[1]
        else f" Both fit in the {format_bytes(budget)} KV budget."
    )
    return Answer(
        f"Llama-3-70B on 8 × H100 at {context:,} tokens: batch {batch} → {2 * batch} reads the same "
        f"**{weights / 1e9:.0f} GB of weights** ({one.ms_weights:.1f} ms both times) but "
        f"**{format_bytes(one.kv_bytes)} → {format_bytes(two.kv_bytes)}** of KV "
        f"({one.ms_kv:.1f} → {two.ms_kv:.1f} ms per step).{caveat}",
        {
            "weight_bytes": (one.weight_bytes, two.weight_bytes),
            "kv_bytes": (one.kv_bytes, two.kv_bytes),
            "kv_ratio": two.kv_bytes / one.kv_bytes,
            "kv_budget_bytes": budget,
            "fits": fits,
            "max_sequences": most,
        },
    )


def streaming_recall(lm: LoadedModel | None = None, sinks: int = 4, recent: int = 1020, back: int = 5000) -> Answer:
    from kvviz.eviction.policies import PolicyState, StreamingLLM

    seen = sinks + recent + back  # tokens so far; the fact sits `back` tokens before the newest
    fact = seen - back
    state = PolicyState(
        positions=torch.arange(seen)[None, None], n_kept=sinks + recent, n_prompt=seen, step=0, kv_heads=1
    )
    keep = StreamingLLM(sinks=sinks).select(state).keep[0, 0]
    kept = bool((keep == fact).any())
    return Answer(
        f"kvviz's StreamingLLM policy after {seen:,} tokens keeps positions 0–{sinks - 1} and "
        f"{int(keep[sinks])}–{int(keep[-1])}: the fact at position {fact:,} is "
        f"**{'kept' if kept else 'evicted'}**, so the model cannot answer from it.",
        {"kept": kept, "n_kept": int(keep.numel()), "fact_position": fact},
    )


def why_kivi(lm: LoadedModel | None) -> Answer:
    if lm is None:
        raise ValueError("This answer is measured on the loaded model.")
    from kvviz.capture.model_io import encode_prompt
    from kvviz.quant.model import channel_outlier_ratio, collect_qkv, evaluate
    from kvviz.quant.schemes import QuantSpec, Scheme

    qkv = collect_qkv(lm, ids=encode_prompt(lm, needle_prompt(), True)[:256])
    k, v = float(np.median(channel_outlier_ratio(qkv, "k"))), float(np.median(channel_outlier_ratio(qkv, "v")))
    vals = QuantSpec("int2", "token", 32)
    ch = evaluate(qkv, Scheme("K per channel", QuantSpec("int2", "channel", 32), vals))
    tok = evaluate(qkv, Scheme("K per token", QuantSpec("int2", "token", 32), vals))
    return Answer(
        f"On {lm.name} ({qkv.n_tokens} tokens): the largest key channel averages **{k:.1f}×** the median "
        f"channel, the largest value channel only **{v:.1f}×** (median over layers and heads). At 2 bits, "
        f"keys per channel lose **{100 * ch.key_error:.1f} %** vs **{100 * tok.key_error:.1f} %** per token.",
        {
            "key_outlier_ratio": k,
            "value_outlier_ratio": v,
            "key_error_per_channel": ch.key_error,
            "key_error_per_token": tok.key_error,
        },
    )


_SAME, _DIFFERENT = "the same logits", "different logits"
_KEPT, _EVICTED = "kept: it can answer", "evicted: it cannot"
_CHANNEL, _TOKEN = "keys per channel", "keys per token"
QUESTIONS = (
    Question(
        "Llama-3-8B has 32 layers, 8 KV heads and head dimension 128. What is its KV cache per token in BF16 "
        "and in FP8?",
        "2 × 32 × 8 × 128 × 2 = 131,072 bytes = 128 KiB in BF16; 64 KiB in FP8.",
        llama3_8b_per_token,
        guess=Guess("Your guess: bytes per token in BF16, in KiB", lambda v: v["bf16_bytes"] / 1024, "KiB"),
    ),
    Question(
        "Why do we not need to cache queries?",
        "A query is only used once, by its own token, at the step where that token is produced. Later tokens "
        "attend to earlier tokens' keys and values, never their queries.",
        why_no_query_cache,
        True,
        Guess(
            "Your guess: does a loop that never stores a query give the same logits as recomputing everything?",
            lambda v: _SAME if v["max_abs_logit_diff"] < v["tolerance"] else _DIFFERENT,
            choices=(_SAME, _DIFFERENT),
        ),
    ),
    Question(
        "Doubling the batch size at fixed context length: what happens to the weight bytes and the KV bytes "
        "read per decode step?",
        "Weight bytes stay the same (shared by the batch); KV bytes double. So "
        "batching amortizes weights but not the KV cache.",
        doubling_the_batch,
        guess=Guess("Your guess: the KV bytes read per step grow by what factor?", lambda v: v["kv_ratio"], "×"),
    ),
    Question(
        "StreamingLLM keeps 4 sink tokens + 1,020 recent tokens. Can the model answer a question about a fact "
        "stated 5,000 tokens earlier?",
        "No. Evicted tokens' K/V are gone; StreamingLLM gives stable fluency "
        "over unbounded streams, not long-range memory.",
        streaming_recall,
        guess=Guess(
            "Your guess: is the fact still in the cache?",
            lambda v: _KEPT if v["kept"] else _EVICTED,
            choices=(_KEPT, _EVICTED),
        ),
    ),
    Question(
        "Why does KIVI quantize keys per channel but values per token?",
        "Keys have outlier channels (a few dimensions consistently large across tokens), so a per-channel scale "
        "isolates them. Values do not show this channel structure, and per-token quantization fits how they "
        "are combined (each output is a weighted sum of value rows).",
        why_kivi,
        True,
        Guess(
            "Your guess: at 2 bits, which loses less of the keys?",
            lambda v: _CHANNEL if v["key_error_per_channel"] < v["key_error_per_token"] else _TOKEN,
            choices=(_CHANNEL, _TOKEN),
        ),
    ),
)
