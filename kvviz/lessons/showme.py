"""A "show me" action (:class:`ShowMe`) and the ready examples whose "Look for" line is read from their stored
result: the live architectures, KVzip beside SnapKV, the disk tier.

Their static ``look_for`` ends with :data:`LIVE_NOTE` and stands in until the example has been computed at
start-up; then the Learn tab shows the line its view registered (``ctx.look_fors``), with that run's numbers.
:mod:`kvviz.lessons.objectives` puts them in the lesson.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvviz.eviction.demos import NEEDLE_BUDGET, NEEDLE_FILLER
from kvviz.examples import NEEDLE_QUESTION, needle_passage


@dataclass(frozen=True)
class ShowMe:
    """Load a ready example into a view: set ``values``, press ``press``, switch to ``tab``, scroll to ``anchor``."""

    label: str
    tab: str
    values: dict = field(default_factory=dict)
    press: str | None = None
    anchor: str | None = None
    look_for: str = ""


LIVE_NOTE = "(its numbers appear here once the example has been computed at start-up)"


def live_architecture(label: str, kind: str, point: str) -> ShowMe:
    """A tiny model of ``kind`` run live in the Memory tab: its real cache tensors next to the formula."""
    return ShowMe(
        label,
        "tab_memory",
        {"memory.arch_kind": kind, "memory.arch_prompt": "The KV cache"},
        "memory.arch_run",
        "arch-summary",
        f"{point} {LIVE_NOTE}",
    )


LIVE_GQA = live_architecture(
    "GQA live: query heads sharing K/V heads",
    "GQA",
    "The cache keeps keys and values per KV head, not per query head: the formula counts KV heads.",
)
LIVE_MLA = live_architecture(
    "MLA live: a latent instead of per-head K/V",
    "MLA",
    "One latent and one RoPE key per token and layer, a fraction of what per-head keys and values take.",
)
LIVE_SHARING = live_architecture(
    "Gemma-4's cross-layer KV sharing, live",
    "KV-sharing",
    "The sharing layers hold nothing of their own; the sliding layers stay flat at their window.",
)
LIVE_STATE = live_architecture(
    "Qwen3-Next's linear-attention state, live",
    "linear hybrid",
    "The gated-DeltaNet layers keep a state of a fixed size, not of no size, beside the layer that grows.",
)

# the Eviction tab's comparison on the needle passage, only the context compressed (the question is fed after it,
# so it cannot vote): SnapKV scores by the last queries, KVzip by how well the cache rebuilds the context
KVZIP_SNAPKV = ShowMe(
    "KVzip vs SnapKV, only the context compressed",
    "tab_eviction",
    {
        "eviction.prompt": needle_passage(*NEEDLE_FILLER),
        "eviction.question": f"Question: {NEEDLE_QUESTION}",
        "eviction.chat": True,
        "eviction.policy": "snapkv",
        "eviction.mode": "tokens",
        "eviction.budget": NEEDLE_BUDGET,
        "eviction.max_new": 16,
        "eviction.compress": "context",
        "eviction.compare_policies": ["snapkv", "kvzip"],
    },
    "eviction.compare",
    "evict-table",
    "With the question outside the compressed part SnapKV's window has nothing to vote with and loses the fact, "
    f"while KVzip, which keeps what rebuilds the context, answers like the full cache. {LIVE_NOTE}",
)

DISK_TIER = ShowMe(
    "The disk tier: blocks spill and come back",
    "tab_blocks",
    {},
    "blocks.disk_demo",
    "disk-demo-chart",
    "A store whose memory holds one prompt: the next prompts push its blocks to disk, and the same prompt "
    f"again reads them back from disk instead of computing them. {LIVE_NOTE}",
)

# the Generate tab's multi-turn chat, two turns already sent: the second starts from the first one's cache
CHAT_REUSE = ShowMe(
    "Chat: the next turn starts from this one's cache",
    "tab_generate",
    {},
    "generate.chat_demo",
    "chat-turns",
    "The second turn's prompt repeats the whole first turn, so the prefix store hands back the first turn's blocks — "
    f"its prompt and its answer — and only the new question is computed. {LIVE_NOTE}",
)

# the Blocks tab's KV-budget section, drawn from the stored replays as it opens: the calculator's capacity, measured
KV_BUDGET = ShowMe(
    "Measured: the room served under a KV budget",
    "tab_blocks",
    {},
    None,
    "kvbudget-note",
    "The room's requests replayed on the model under one KV budget: paged blocks run several times as many "
    "sequences at once as reserving each one's whole context, and tokens per second rise with the batch — the "
    f"calculator's capacity, measured. {LIVE_NOTE}",
)
