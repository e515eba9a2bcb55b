"""Every bound on every input, and what a model job will cost, in one place.

A public deployment takes numbers from strangers: a pasted ``config.json``, the Memory tab's
fields, the API's arguments. Each is checked here against a range that no real model comes near
but that keeps the work small, before any work starts, and each refusal is a ``ValueError`` that
names the field, the value and the allowed range. Nothing here imports gradio.

The bounds are generous on purpose: the largest released models have ~126 layers, 128 query
heads, head dims of 256, hidden sizes of 16K and contexts of 10M tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import overload

# ---- a config.json ------------------------------------------------------------------------------
MAX_CONFIG_BYTES = 256 * 1024  # a config.json is a few KiB; a deployment may change it (KVVIZ_MAX_CONFIG_BYTES)
MAX_PREFIX_DISK_MB = 1 << 20  # the prefix store's disk tier: at most 1 TiB (KVVIZ_PREFIX_DISK_MB)
MAX_LAYERS = 1024
MAX_HEADS = 4096
MAX_HEAD_DIM = 16_384
MAX_HIDDEN = 1 << 20
MAX_CONTEXT = 1 << 27  # 134M tokens
MAX_STATE_DIM = 1 << 20

# field name (every alias a config may use) → (lowest, highest) allowed whole number
CONFIG_BOUNDS: dict[str, tuple[int, int]] = {
    **dict.fromkeys(("num_hidden_layers", "n_layer", "num_layers", "n_layers"), (1, MAX_LAYERS)),
    **dict.fromkeys(("num_attention_heads", "n_head", "num_heads", "n_heads"), (1, MAX_HEADS)),
    **dict.fromkeys(("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num"), (1, MAX_HEADS)),
    **dict.fromkeys(("linear_num_key_heads", "linear_num_value_heads", "n_groups"), (1, MAX_HEADS)),
    **dict.fromkeys(("head_dim", "linear_key_head_dim", "linear_value_head_dim"), (1, MAX_HEAD_DIM)),
    **dict.fromkeys(("hidden_size", "n_embd", "d_model", "dim", "intermediate_size"), (1, MAX_HIDDEN)),
    **dict.fromkeys(("kv_lora_rank",), (1, MAX_HEAD_DIM)),
    **dict.fromkeys(("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"), (0, MAX_HEAD_DIM)),
    **dict.fromkeys(("sliding_window", "attention_chunk_size"), (1, MAX_CONTEXT)),
    **dict.fromkeys(("max_position_embeddings", "n_positions", "max_seq_len"), (1, MAX_CONTEXT)),
    **dict.fromkeys(("max_window_layers", "attn_layer_offset"), (0, MAX_LAYERS)),
    **dict.fromkeys(("sliding_window_pattern", "no_rope_layer_interval", "attn_layer_period"), (1, MAX_LAYERS)),
    **dict.fromkeys(("expand", "mamba_expand"), (1, 64)),
    **dict.fromkeys(("conv_kernel", "mamba_d_conv", "linear_conv_kernel_dim"), (1, 1024)),
    **dict.fromkeys(("state_size", "mamba_d_state"), (1, MAX_STATE_DIM)),
    **dict.fromkeys(("global_head_dim", "index_head_dim"), (1, MAX_HEAD_DIM)),  # Gemma-4 global layers, DSA indexer
    "num_global_key_value_heads": (1, MAX_HEADS),
}
MAX_PARAMETERS = 10**15  # "_num_parameters" of a preset: a quadrillion is beyond any model


def _range(lo: float, hi: float) -> str:
    return f"{lo:,} … {hi:,}" if isinstance(lo, int) else f"{lo:g} … {hi:g}"


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "…"


@overload
def config_int(cfg: dict, name: str, default: int) -> int: ...
@overload
def config_int(cfg: dict, name: str, default: None = None) -> int | None: ...
def config_int(cfg: dict, name: str, default: int | None = None) -> int | None:
    """``cfg[name]`` as a whole number inside its bound (``default`` when absent or null).

    Refuses booleans, text, fractions, negative counts and anything outside ``CONFIG_BOUNDS``,
    naming the field, its value and the allowed range.
    """
    value = cfg.get(name)
    if value is None:
        return default
    return bounded_int(value, f"config field {name!r}", *CONFIG_BOUNDS[name])


def bounded_int(value, what: str, lo: int, hi: int) -> int:
    """``value`` as an int in [lo, hi], or a ValueError naming ``what``, the value and the range."""
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    if not ok or int(value) != value:
        raise ValueError(f"{what} must be a whole number in {_range(lo, hi)}; got {_shown(value)}.")
    if not lo <= value <= hi:
        raise ValueError(f"{what} = {_shown(value)} is outside the allowed range {_range(lo, hi)}.")
    return int(value)


def check_list_length(value, what: str, length: int) -> list:
    """A per-layer list must have exactly one entry per layer (and so is bounded by ``MAX_LAYERS``)."""
    if not isinstance(value, list) or len(value) != length:
        shown = f"{len(value):,} entries" if isinstance(value, list) else _shown(value)
        raise ValueError(f"{what} must list one entry per layer ({length:,}); got {shown}.")
    return value


# ---- sampling -------------------------------------------------------------------------------------
MAX_TEMPERATURE = 5.0
# Below this a temperature is greedy: logits / T overflow float32 to inf under ~1e-37 (softmax then gives
# NaN, and sampling raises), and already at 1e-4 a runner-up 0.01 below the top logit has probability
# e^-100: the draw is the argmax but for exact ties.
MIN_TEMPERATURE = 1e-4
# Below this a top-p keeps only the most likely token, as greedy decoding does: the first token's share alone
# passes it (a vocabulary of 10⁶ tokens gives the top one at least that). float32 holds no value below ~1.4e-45
# (1e-300 and 5e-324 become 0 there, and a nucleus of mass 0 keeps no token), so smaller ones are raised to it.
MIN_TOP_P = 1e-6


# ---- the engine ----------------------------------------------------------------------------------
# Finished runs the engine keeps to answer late duplicates (a room pressing the same example): their traces
# together at most this many bytes. A short chat's trace is well under 1 MiB, so a room's duplicates are all
# kept; one long prompt's attention maps are hundreds of MiB, and kept 16 at a time they held gigabytes.
FINISHED_RUNS_BYTES = 64 * 2**20
# seconds the engine or a gate stays idle before the freed heap goes back to the OS (gc and malloc_trim hold the
# interpreter for a few hundred milliseconds: right at a room's end they would delay the answers being sent)
IDLE_RELEASE_S = 1.5


# ---- the Memory tab and /memory ------------------------------------------------------------------
@dataclass(frozen=True)
class Bound:
    """One numeric input: its range and whether it must be whole."""

    lo: float
    hi: float
    whole: bool = True


CALCULATOR_BOUNDS: dict[str, Bound] = {
    "context": Bound(1, MAX_CONTEXT),
    "batch": Bound(1, 1 << 20),
    "tp": Bound(1, 1024),
    "gpus": Bound(1, 100_000),
    "group_size": Bound(1, 1 << 20),
    "gpu_mem_gb": Bound(0.001, 100_000.0, whole=False),
    "bandwidth_tbps": Bound(0.001, 1_000.0, whole=False),
    "weights_gb": Bound(0.0, 10_000_000.0, whole=False),
    "reserve": Bound(0.0, 0.95, whole=False),
    "kv_producing": Bound(1, MAX_LAYERS),  # layers that store K/V; the rest share (cross-layer KV sharing)
}


def calculator_number(name: str, value, label: str | None = None) -> float | int:
    """A Memory-tab / ``/memory`` input checked against :data:`CALCULATOR_BOUNDS`."""
    bound = CALCULATOR_BOUNDS[name]
    what = label or name
    if bound.whole:
        if isinstance(value, str):
            value = _parse(value, what, bound)
        return bounded_int(value, what, int(bound.lo), int(bound.hi))
    number = _parse(value, what, bound) if isinstance(value, str) else value
    if isinstance(number, bool) or not isinstance(number, (int, float)) or not math.isfinite(number):
        raise ValueError(f"{what} must be a number in {_range(bound.lo, bound.hi)}; got {_shown(value)}.")
    if not bound.lo <= number <= bound.hi:
        raise ValueError(f"{what} = {_shown(value)} is outside the allowed range {_range(bound.lo, bound.hi)}.")
    return float(number)


def _parse(text: str, what: str, bound: Bound) -> float:
    try:
        return float(text.strip())
    except ValueError:
        kind = "a whole number" if bound.whole else "a number"
        raise ValueError(f"{what} must be {kind} in {_range(bound.lo, bound.hi)}; got {_shown(text)}.") from None


# ---- what a model job costs ------------------------------------------------------------------------
@dataclass(frozen=True)
class JobCost:
    """The work and memory of a model job, known before it runs.

    ``token_passes`` counts token × layer forward passes (prefill plus decode, for every run the job
    makes, plus any repeat pass); ``key_reads`` counts the attention keys those queries read (the quadratic
    part); ``bytes`` is the KV cache plus the recorder's arrays at the job's longest sequence;
    ``repeat_tokens`` the tokens fed by repeat passes over a prefilled cache (KVzip's reconstruction).
    """

    prompt_tokens: int
    new_tokens: int
    layers: int
    runs: int
    token_passes: int
    key_reads: int
    bytes: int
    repeat_tokens: int = 0

    def describe(self) -> str:
        runs = f"{self.runs} runs of " if self.runs > 1 else ""
        repeat = f" + {self.repeat_tokens:,} repeat-pass tokens" if self.repeat_tokens else ""
        return (
            f"{runs}{self.prompt_tokens:,} prompt + {self.new_tokens:,} new tokens{repeat} × {self.layers} layers "
            f"({self.key_reads:.3g} attention key reads, ~{self.bytes / 2**20:,.0f} MiB)"
        )


def job_cost(
    prompt_tokens: int,
    new_tokens: int,
    layers: int,
    bytes_per_token: int,
    runs: int = 1,
    window: int | None = None,
    repeat_passes: tuple[tuple[int, int], ...] = (),
) -> JobCost:
    """What ``runs`` generations of ``new_tokens`` after a ``prompt_tokens`` prompt will cost.

    ``bytes_per_token`` is the model's KV bytes per token (all layers); the recorder keeps about as
    much again beside the cache (attention summaries and statistics), so the estimate doubles it.
    ``window`` caps the keys each decode step reads (a cache that holds at most that many entries).
    ``repeat_passes``: (cached, fed) per pass that feeds ``fed`` tokens through a copy of a prefilled cache
    of ``cached`` entries (KVzip's repeat of the context): the ``i``-th fed token reads ``cached + i`` keys,
    and the copy plus the fed tokens' K/V sit beside the run's cache (no recorder arrays).
    """
    total = prompt_tokens + new_tokens
    prefill = prompt_tokens * (prompt_tokens + 1) // 2
    decode = _sum_range(prompt_tokens + 1, total)  # step t reads the prompt_tokens + t keys it can see
    if window is not None and total > window:
        below = max(0, min(total, window) - prompt_tokens)  # steps that still see fewer than ``window`` keys
        decode = _sum_range(prompt_tokens + 1, prompt_tokens + below) + (new_tokens - below) * window
    reads = runs * layers * (prefill + decode)
    held = total if window is None else min(total, window)
    fed = sum(q for _, q in repeat_passes)
    reads += layers * sum(q * n + q * (q + 1) // 2 for n, q in repeat_passes)
    copy = max((n + q for n, q in repeat_passes), default=0) * bytes_per_token
    return JobCost(
        prompt_tokens,
        new_tokens,
        layers,
        runs,
        layers * (runs * total + fed),
        reads,
        2 * runs * held * bytes_per_token + copy,
        fed,
    )


def _sum_range(lo: int, hi: int) -> int:
    """lo + (lo + 1) + … + hi (0 when hi < lo)."""
    return 0 if hi < lo else (lo + hi) * (hi - lo + 1) // 2


def model_seconds(cost: JobCost, key_reads_per_s: float) -> float:
    """The model time a job will take, estimated from its attention key reads at the deployment's rate: the
    part that grows with the square of the prompt, and the one that makes a long prompt long (short runs
    batched in the engine cost little beside it)."""
    return cost.key_reads / key_reads_per_s


def check_cost(cost: JobCost, max_key_reads: int, max_bytes: int | None) -> None:
    """Refuse a job whose cost passes the deployment's limits, saying what to shrink."""
    if cost.key_reads > max_key_reads:
        raise ValueError(
            f"This job is too large for this deployment: {cost.describe()}; the limit is "
            f"{max_key_reads:.3g} key reads. Use a shorter prompt, fewer new tokens or fewer runs."
        )
    if max_bytes is not None and cost.bytes > max_bytes:
        raise ValueError(
            f"This job would need ~{cost.bytes / 2**20:,.0f} MiB for its cache and trace; the server "
            f"can spare {max_bytes / 2**20:,.0f} MiB now. Use a shorter prompt or fewer new tokens."
        )


# ---- the app's own inputs (kvviz/ui) --------------------------------------------------------------------
MAX_QUESTION_CHARS = 2000  # the Eviction tab's question box: a sentence or two, fed after the context
MAX_BUDGET_TOKENS = 10**6  # entries a policy keeps per layer and KV head (far above any prompt the app takes)
MAX_STEP = 10**6  # a replay slider's step (clamped to the run's last step afterwards)
MAX_FAULT_STEP = (
    4096  # the decode step (or prefix block) a debugger fault strikes first; the run's length bounds it further
)
MAX_DEBUG_NEW_TOKENS = 64  # tokens a Break-the-cache run generates (the run, a clean run and one recomputation)
MAX_BLOCK_SIZE = 4096  # tokens per paged block
MAX_SEED = 2**32 - 1
NO_CONTEXT_LIMIT = 10**9  # a model whose config states no context length: the deployment's prompt limit decides
MAX_HISTORY_MESSAGES = 64  # a chat's earlier messages (32 turns) sent with a new one; the token limit decides the rest
MAX_HISTORY_CHARS = 256 * 1024  # a history's JSON text, checked before it is parsed


def prompt_limit(max_prompt_tokens: int, context_length: int | None) -> int:
    """Tokens a request's prompt and generation may fill: the deployment's limit, or the model's context if smaller."""
    return min(max_prompt_tokens, context_length or NO_CONTEXT_LIMIT)


def check_prompt_length(n_prompt: int, n_new: int, limit: int, which: str = "The prompt") -> None:
    """ValueError when ``n_prompt`` tokens plus ``n_new`` new ones pass ``limit``, saying what to shorten."""
    if n_prompt + n_new <= limit:
        return
    if n_new == 0:
        raise ValueError(f"{which} is {n_prompt:,} tokens; the limit is {limit:,}.")
    new = f"{n_new:,} new token" + ("" if n_new == 1 else "s")
    raise ValueError(
        f"{which} is {n_prompt:,} tokens; with {new} that exceeds the limit of {limit:,} tokens. "
        "Shorten the prompt or generate fewer tokens."
    )


# ---- a GPU lease (ZeroGPU's ``spaces.GPU(duration=…)``) -------------------------------------------------
# What one model job asks the GPU for, from its cost estimate: ZeroGPU checks the asked duration against the
# visitor's remaining daily quota (about two minutes for a visitor who is not logged in), so a short chat
# must not ask for what a 4K-token prompt needs. The rates are generous upper bounds for the bundled
# 135M-parameter model with kvviz's recorder on a ZeroGPU slice.
GPU_LEASE_FLOOR_S = 10  # start-up, the verification pass and a margin: no job asks for less
GPU_LEASE_CEILING_S = 120  # no job asks for more (the longest run the deployment's limits allow)
GPU_LAYER_STEP_S = 2e-3  # one decode step through one layer, recorder included
GPU_LAYER_TOKEN_S = 2e-5  # one prompt token through one layer in the prefill
GPU_KEY_READ_S = 1e-9  # one attention key read (the quadratic part of a long prompt)


def lease_seconds(cost: JobCost, ceiling: float = GPU_LEASE_CEILING_S, floor: float = GPU_LEASE_FLOOR_S) -> int:
    """Whole seconds of GPU a job with this cost asks for: its estimated run time plus a quarter, within
    [floor, ceiling]."""
    decode = cost.runs * cost.new_tokens * cost.layers * GPU_LAYER_STEP_S
    prefill = (cost.runs * cost.prompt_tokens + cost.repeat_tokens) * cost.layers * GPU_LAYER_TOKEN_S
    estimate = floor + 1.25 * (decode + prefill + cost.key_reads * GPU_KEY_READ_S)
    return int(math.ceil(min(max(estimate, floor), max(ceiling, floor))))


MAX_KV_EVENTS = 50_000  # events the prefix store's KV event log keeps before it folds them into its current blocks
MAX_EVENT_LOG_BYTES = 64 * 2**20  # a KV event log imported into the Blocks view (a JSON Lines file)

# ---- serving under a KV budget (kvviz/engine/budget.py, bench/kv_budget.py, python -m kvviz serve-sim) --------
MIN_KV_BUDGET_BYTES = 1024  # a kibibyte: less holds no block of even a tiny test model
MAX_KV_BUDGET_BYTES = 64 * 2**30  # a replay's KV budget: far above what the CPU machine holds
MAX_KV_BUDGET_REQUESTS = 256  # requests in one replayed trace (the room: 73)
MAX_KV_BUDGET_NEW_TOKENS = 256  # tokens each replayed request may generate
MAX_KV_BUDGET_STEPS = 100_000  # a replay's steps (arrival steps included): more is a scheduling bug, stopped
LIVE_KV_BUDGET_STUDENTS = 8  # students in a visitor's live replay (one wave): four modes in seconds on a CPU
LIVE_KV_BUDGET_NEW_TOKENS = 8  # tokens each request of a live replay generates
