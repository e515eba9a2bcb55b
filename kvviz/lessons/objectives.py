"""The lesson behind the Learn tab: the chapter's objectives and pitfalls, each tied to a kvviz view
(its questions: :mod:`kvviz.lessons.questions`).

Views are named by tab id (``tab_memory``) and the registered components (``"memory.preset"``) a
"show me" action sets before pressing the view's button; the UI resolves those names.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvviz.eviction.demos import NEEDLE_POLICIES
from kvviz.examples import CHAT_QUESTION, needle_prompt
from kvviz.lessons.nocache import DRAMATIC
from kvviz.lessons.showme import (
    CHAT_REUSE,
    DISK_TIER,
    KV_BUDGET,
    KVZIP_SNAPKV,
    LIVE_GQA,
    LIVE_MLA,
    LIVE_NOTE,
    LIVE_SHARING,
    LIVE_STATE,
    ShowMe,
)
from kvviz.units import format_bytes

H100 = "H100 80GB (SXM)"


@dataclass(frozen=True)
class Objective:
    number: int
    title: str  # a few words for a tab title
    chapter: str  # the objective as the chapter states it
    explanation: str  # what it means, in kvviz's words
    show_me: tuple[ShowMe, ...]


@dataclass(frozen=True)
class Pitfall:
    title: str
    explanation: str
    show_me: ShowMe


# ---- ready examples -------------------------------------------------------------------------------
_MEM = {"memory.source": "Preset", "memory.kv_dtype": "bf16", "memory.gpu": H100, "memory.gpus": 8, "memory.tp": 0}
EQUIVALENCE = ShowMe(
    "Generate and check cached = recomputed",
    "tab_generate",
    {"generate.prompt": CHAT_QUESTION, "generate.chat": True, "generate.max_new": 24},
    "generate.button",
    "equivalence",
    "After the last token, the largest logit difference between cached decoding and full "
    "recomputation (fp32) is far below 1e-3.",
)
NOCACHE = ShowMe(
    "Time both loops (cache vs no cache)",
    "tab_nocache",
    {"nocache.prompt": DRAMATIC.prompt, "nocache.chat": DRAMATIC.chat, "nocache.new_tokens": DRAMATIC.new_tokens},
    "nocache.button",
    "nocache-passes",
    "With a ~300-token prompt the loop without a cache is several times slower and the tokens are "
    "identical. Its passes look straight: with N ≪ L, N·L dominates and the N²/2 term is a few per "
    "cent; the chart's right panel shows where it takes over — the chapter's 1,000 + 1,000, 750×. (A "
    "few-token prompt hides the time gap: each forward's fixed overhead outweighs the tokens it re-runs.)",
)
WASTE = ShowMe(
    "Count the waste of a real run",
    "tab_generate",
    {"generate.prompt": "Once upon a time", "generate.chat": False, "generate.max_new": 16},
    "generate.button",
    "waste",
    "Token-forward passes with and without the cache for this run.",
)
_BREAK = {"breakcache.prompt": CHAT_QUESTION, "breakcache.new_tokens": 8, "breakcache.step": 2, "breakcache.layer": 0}
CAUSAL_DECODE = ShowMe(
    "Decode with a causal mask",
    "tab_breakcache",
    {**_BREAK, "breakcache.fault": "causal_decode"},
    "breakcache.button",
    "breakcache-map",
    "The ring sits at step 2, layer 0: the keys and values still agree, but the attention output does not — "
    f"the single query under is_causal=True saw only the first key — and every later layer inherits it. {LIVE_NOTE}",
)
FORGET_APPEND = ShowMe(
    "Forget to append",
    "tab_breakcache",
    {**_BREAK, "breakcache.fault": "not_appended"},
    "breakcache.button",
    "breakcache-map",
    "At step 2 layer 0's cache holds one entry fewer than the tokens fed (the cache-length cell off the "
    f"scale): that step attended to the stale cache, and the position stays missing. {LIVE_NOTE}",
)
LLAMA70_8K = ShowMe(
    "Calculator on Llama-3-70B at 8K",
    "tab_memory",
    {**_MEM, "memory.preset": "Llama-3-70B", "memory.context": 8192, "memory.batch": 1},
    "memory.button",
    "memory-formula",
    "2 × 80 layers × 8 KV heads × 128 × 2 B = 320 KiB per token; 8,192 tokens (the context this config "
    "is set for) × 320 KiB = 2.5 GiB per sequence.",
)
LLAMA70 = ShowMe(
    "… and at 128K",
    "tab_memory",
    {**_MEM, "memory.preset": "Llama-3-70B", "memory.context": 131072, "memory.batch": 1},
    "memory.button",
    "memory-formula",
    "The same 320 KiB per token, 16× the tokens: 40 GiB at 128K — half an 80 GB H100 for one user. The "
    "config is set for 8,192 tokens; 128K is the chapter's long-context case on the same shape.",
)
CAPACITY = ShowMe(
    "Batch capacity on 8 × H100",
    "tab_memory",
    {**_MEM, "memory.preset": "Llama-3-70B", "memory.context": 8192, "memory.batch": 162},
    "memory.button",
    "memory-capacity",
    "About 162 sequences fit at 8K tokens but only 10 at 128K; the KV budget, not compute, sets it.",
)
DECODE = ShowMe(
    "Decode time: weights vs KV",
    "tab_memory",
    {**_MEM, "memory.preset": "Llama-3-70B", "memory.context": 8192, "memory.batch": 162},
    "memory.button",
    "memory-decode",
    "≈ 5.2 ms to read the weights, ≈ 16 ms to read 162 × 8K of KV.",
)
SINKS = ShowMe(
    "Sink map of the real model",
    "tab_attention",
    {"generate.prompt": needle_prompt(), "generate.chat": True, "generate.max_new": 16},
    "generate.button",
    "attn-sink-map",
    "In the later half of the layers the heads give the first 4 tokens far more than uniform attention would "
    "(about 5 %): between a quarter and two thirds of their attention, layer by layer, with many heads under half "
    "— the map's subtitle gives this run's numbers.",
)
NEEDLE = ShowMe(
    "Needle demo under eviction",
    "tab_eviction",
    {"eviction.compress": "question", "eviction.compare_policies": list(NEEDLE_POLICIES)},
    "eviction.needle",
    "evict-verdict",
    "The full cache answers 4721; StreamingLLM at a small budget has evicted the fact, SnapKV kept it "
    "(the demo runs those two; tick H2O and press Compare to add it).",
)
SINKS_MATTER = ShowMe(
    "Perplexity with and without the sink tokens",
    "tab_eviction",
    {},
    "eviction.sinks",
    "evict-sinks-plot",
    "With a small cache, dropping the first 4 tokens makes perplexity explode (a minute on a CPU).",
)
KIVI = ShowMe(
    "KIVI: outlier key channels, 2-bit",
    "tab_quant",
    {
        "quant.prompt": needle_prompt(),
        "quant.chat": True,
        "quant.layer": 15,
        "quant.head": 0,
        "quant.format": "int2",
        "quant.key_axis": "channel",
        "quant.value_axis": "token",
        "quant.group": 32,
        "quant.window": 32,
    },
    "quant.button",
    "quant-keys",
    "A few key channels are bright across every token; at 2 bits keys per channel beat keys per token.",
)

SIDE_CHANNEL = ShowMe(
    "Time a second session",
    "tab_blocks",
    {"blocks.leak_tries": 3},
    "blocks.leak_run",
    "leak-chart",
    "With one store for everyone, a prompt another session already sent answers several times sooner than a "
    "new one, so the second session guesses right nearly every time; with a salt per session both take the "
    "prefill's time and its guesses are a coin flip.",
)

OBJECTIVES = (
    Objective(
        1,
        "Why a cache",
        "Why generating without a cache wastes quadratic work, and exactly what the KV cache stores.",
        "A causal model never revises a past token, so re-running the whole sequence at every step redoes "
        "work whose result is already known. Only each past token's key and value vectors — in every layer "
        "and KV head — are needed again; that is all the cache holds.",
        (NOCACHE, WASTE),
    ),
    Objective(
        2,
        "Decode step",
        "Implement a decode step that appends to a KV cache and verify it matches full recomputation.",
        "A decode step computes q, k, v for the one new token, appends k and v to the cache and attends over "
        "it. kvviz runs this loop on a real model and re-runs the whole sequence at the end to prove the "
        "logits match. Break the cache on purpose to see what a wrong decode step looks like, and where the "
        "debugger finds it first.",
        (EQUIVALENCE, CAUSAL_DECODE, FORGET_APPEND),
    ),
    Objective(
        3,
        "Size formula",
        "Derive the KV-cache size formula and apply it to Llama-3-70B (8K and 128K contexts) and to MHA "
        "vs GQA vs MQA vs MLA.",
        "Per token: 2 (K and V) × layers × KV heads × head dim × bytes. The number of KV heads — not query "
        "heads — is what GQA, MQA and MLA shrink.",
        (LLAMA70_8K, LLAMA70),
    ),
    Objective(
        4,
        "Batch & speed",
        "Explain how KV memory — not compute — caps batch size, and why long contexts make decode slower.",
        "What the weights leave of GPU memory is the KV budget; divide by one sequence's cache to get the "
        "batch. Every decode step also reads every sequence's whole cache, so at long context that read, "
        "not the weights, sets the time per token. A cache that costly is worth keeping: engines reuse a "
        "prompt's computed blocks — a chat's next turn starts from the last one's cache — and a tier on disk "
        "holds what memory cannot.",
        (CAPACITY, KV_BUDGET, DECODE, CHAT_REUSE, DISK_TIER),
    ),
    Objective(
        5,
        "Shrinking it",
        "Describe at intuition level the main ways to shrink the cache: quantization, eviction "
        "(StreamingLLM, H2O, SnapKV), and architectural changes.",
        "Store fewer bits (FP8; 2-bit with KIVI's per-channel keys), store fewer tokens (keep the attention "
        "sinks and what the task needs — lossy, and what a policy keeps depends on what it scores: SnapKV "
        "needs the question, KVzip does not), or change the architecture so there is less to store: fewer "
        "KV heads than query heads (GQA), one latent per token (MLA), layers that reuse an earlier layer's K/V "
        "(Gemma-4), a fixed-size state instead of a growing cache (Qwen3-Next's linear attention).",
        (SINKS, NEEDLE, KVZIP_SNAPKV, KIVI, LIVE_GQA, LIVE_MLA, LIVE_SHARING, LIVE_STATE),
    ),
)


_PIT_MEM = {**_MEM, "memory.context": 131072, "memory.batch": 1}
PITFALLS = (
    Pitfall(
        "Forgetting the factor 2",
        "The cache holds a key *and* a value per token, layer and KV head.",
        ShowMe(
            "The formula, with numbers",
            "tab_memory",
            {**_PIT_MEM, "memory.preset": "Llama-3-70B"},
            "memory.button",
            "memory-formula",
            "The leading 2 × in the formula.",
        ),
    ),
    Pitfall(
        "Query heads instead of KV heads",
        "Llama-3-70B has 64 query heads but stores only 8 KV heads: using 64 "
        "overstates its cache 8× (that is MHA's row in the table).",
        ShowMe(
            "MHA / GQA / MQA / MLA table",
            "tab_memory",
            {**_PIT_MEM, "memory.preset": "Llama-3-70B"},
            "memory.button",
            "memory-table",
            "2.5 MiB (MHA) vs 320 KiB (GQA) per token.",
        ),
    ),
    Pitfall(
        "MLA's shape",
        "MLA stores one latent plus a small RoPE key per token and layer: no factor 2, no head count.",
        ShowMe(
            "DeepSeek-V3 in the calculator",
            "tab_memory",
            {**_PIT_MEM, "memory.preset": "DeepSeek-V3"},
            "memory.button",
            "memory-formula",
            "(512 + 64) × 61 layers × 2 B = 70,272 bytes per token.",
        ),
    ),
    Pitfall(
        "Assuming tensor parallelism shrinks total KV",
        "TP splits KV heads across GPUs; with fewer KV heads than GPUs the heads are replicated and the total grows.",
        ShowMe(
            "Llama-3-70B at TP = 16",
            "tab_memory",
            {**_PIT_MEM, "memory.preset": "Llama-3-70B", "memory.gpus": 16, "memory.tp": 16},
            "memory.button",
            "memory-summary",
            "8 KV heads on 16 GPUs: every head stored twice.",
        ),
    ),
    Pitfall(
        "Ignoring KV reads in latency",
        "Every decode step reads every sequence's cache; at long context that "
        "costs more time than reading the weights.",
        DECODE,
    ),
    Pitfall(
        "Sharing one cache between strangers",
        "A prefix cache shared by every user answers a prompt someone already sent without computing it: the "
        "time to first token tells a second user what the first one sent. Salt each session's block hashes "
        "(vLLM's cache_salt) where users are strangers; a lecture room shares its system prompt on purpose.",
        SIDE_CHANNEL,
    ),
    Pitfall("Treating eviction as free", "Evicted entries are gone: a question about them cannot be answered.", NEEDLE),
    Pitfall(
        "Dropping attention sinks",
        "The first tokens soak up attention in most heads; a window that lets them go breaks the model.",
        SINKS_MATTER,
    ),
)


# ---- the decode walkthrough (presentation mode steps through it) -------------------------------------
def decode_step_view(trace, step: int) -> tuple[list[tuple[str, str | None]], str]:
    """Step ``step`` of a trace (0 = prefill): token spans (cached / new / next) and what the step computed."""
    if trace is None or not trace.steps:
        raise ValueError("No generation yet: press “Load the example” or generate in the Generate tab.")
    if not 0 <= step < len(trace.steps):
        raise ValueError(f"step must be in 0…{len(trace.steps) - 1}, got {step}.")
    s, n = trace.steps[step], trace.n_prompt
    fed_end = n + step  # tokens in the cache after this step's forward
    fed_start = 0 if step == 0 else fed_end - 1
    spans: list[tuple[str, str | None]] = [
        (t, "in cache" if i < fed_start else "computed this step") for i, t in enumerate(trace.tokens[:fed_end])
    ]
    spans.append((s.token, "predicted next"))
    new = fed_end - fed_start
    fed = f"fed {new} tokens, computed their K and V" if new > 1 else "fed 1 token, computed its K and V"
    layers = len(s.layer_bytes)
    md = (
        f"**Step {step}{' (prefill)' if step == 0 else ''}:** {fed} and appended them; the cache now holds "
        f"**{s.cache_lens[0]} tokens per layer** ({format_bytes(s.layer_bytes[0])} in layer 0) — "
        f"**{format_bytes(s.cache_bytes)} over all {layers} layers**. Without a cache this step would recompute K/V for all {fed_end} tokens "
        f"({fed_end - new} of them redundant). Predicted next: **{s.token!r}**."
    )
    return spans, md
