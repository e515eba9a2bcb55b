"""The one eviction interface: a budget, what a policy sees (PolicyState) and what it returns (Selection).

A policy is a dataclass whose fields are its hyper-parameters. ``select(state)`` turns the cache's
held positions (and, for score-based policies, the attention those positions received) into the
absolute positions each layer and KV head keeps. Shapes: ``Lyr`` layers, ``Hq`` query heads,
``Hkv`` KV heads, ``n`` entries held now, ``k`` entries kept, ``T`` tokens seen, ``L`` prompt tokens.

Positions are absolute token indices (0 = first prompt token), never cache slots, so a selection
means the same thing whatever the cache held before.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

if TYPE_CHECKING:
    from kvviz.eviction.query_stats import QueryStats

# role codes of a kept entry (Selection.roles) — the token strip's colours
EVICTED, KEPT, SINK, WINDOW, HEAVY = 0, 1, 2, 3, 4
PAD = -1  # position of an empty slot in a ragged selection or cache (a head that keeps fewer entries)
ROLE_NAMES = {EVICTED: "evicted", KEPT: "kept", SINK: "sink", WINDOW: "window", HEAVY: "heavy hitter"}


def n_kept_for(n_tokens: int, budget: int | None = None, ratio: float | None = None) -> int:
    """Entries kept per layer and KV head (the cache's capacity under the policy) for a prompt of ``n_tokens``.

    Exactly one of ``budget`` (absolute tokens) and ``ratio`` (compression ratio r: the fraction
    removed) is given; with a ratio ``n_kept = max(1, int(L × (1 − r)))``. An absolute budget is
    returned as is: a budget ≥ L evicts nothing after the prefill, and the policies that evict while
    decoding let the cache grow up to it first.
    """
    if n_tokens < 1:
        raise ValueError("The prompt is empty: there is nothing to compress.")
    if (budget is None) == (ratio is None):
        raise ValueError("Give exactly one of a budget (tokens kept) or a compression ratio.")
    if budget is not None:
        if isinstance(budget, bool) or not isinstance(budget, (int, float)) or int(budget) != budget or budget < 1:
            raise ValueError(f"The budget must be a whole number of tokens ≥ 1, got {budget!r}.")
        return int(budget)
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not (0.0 <= float(ratio) < 1.0):
        raise ValueError(f"The compression ratio must be in [0, 1) (the fraction of entries removed), got {ratio!r}.")
    return max(1, int(n_tokens * (1 - float(ratio))))


def group_mean(scores: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """Average per-query-head scores over each KV group: [..., Hq, n] → [..., Hkv, n].

    Query head h reads KV head h // group (transformers' ``repeat_kv`` order), and the cache is
    stored per KV head, so a KV head keeps what its group votes for on average.
    """
    hq = scores.shape[-2]
    if hq % kv_heads:
        raise ValueError(f"{hq} query heads do not split into {kv_heads} KV groups.")
    return scores.reshape(*scores.shape[:-2], kv_heads, hq // kv_heads, scores.shape[-1]).mean(-2)


@dataclass
class PolicyState:
    """What a policy may look at when it decides, after the prefill (step 0) or a decode step.

    ``positions`` [Lyr, Hkv, n]: absolute positions the cache holds now, ascending per head.
    ``colsum`` [Lyr, Hq, T]: attention each position has received, summed over every query so far
    (the Recorder's running column sums; H2O). ``window_rows`` [Lyr, Hq, W, L]: exact attention
    rows of the last W prompt queries over the L prompt keys (SnapKV, TOVA). ``keys``/``values``
    [Lyr, Hkv, n, D]: the held entries as stored (RoPE applied to keys), aligned with ``positions``
    (KNorm, ExpectedAttention). ``query_stats``: the prefill queries' statistics before RoPE
    (:class:`~kvviz.eviction.query_stats.QueryStats`; ExpectedAttention). ``reconstruction`` [Lyr, Hkv, n]:
    the largest attention the context-reconstruction pass paid each entry (:mod:`kvviz.eviction.reconstruction`;
    KVzip).
    """

    positions: torch.Tensor
    n_kept: int
    n_prompt: int
    step: int
    kv_heads: int
    colsum: torch.Tensor | None = None
    window_rows: torch.Tensor | None = None
    keys: torch.Tensor | None = None
    values: torch.Tensor | None = None
    query_stats: QueryStats | None = None
    ratio: float | None = None  # the compression ratio asked for, when the budget was given as one
    reconstruction: torch.Tensor | None = None


@dataclass
class Selection:
    """A decision: ``keep`` [Lyr, Hkv, k] absolute positions kept (ascending per head).

    Policies whose budget differs by layer or KV head (``Policy.ragged``) pad each head's list
    with ``PAD`` (-1) after its kept positions; k is then the largest count.

    ``roles`` [Lyr, Hkv, k]: why each entry stays (SINK / WINDOW / HEAVY / KEPT). ``scores``
    [Lyr, Hkv, n] the score of every entry held before the decision (NaN where the policy does not
    score, e.g. protected windows), aligned with ``state.positions``; None for score-free policies.
    """

    keep: torch.Tensor
    roles: torch.Tensor
    scores: torch.Tensor | None = None


@dataclass
class Policy:
    """Base of every policy. Subclasses set the class variables and implement :meth:`select`."""

    name: ClassVar[str] = ""
    title: ClassVar[str] = ""
    paper: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    score_label: ClassVar[str] = ""  # what the scores mean, with units, for the "scores behind the choice" chart
    evicts_while_decoding: ClassVar[bool] = False  # True: keep the cache at n_kept after every generated token
    needs_colsum: ClassVar[bool] = False  # needs the accumulated attention of every query (Recorder.colsum)
    needs_window_rows: ClassVar[bool] = False  # needs the observation-window rows of the prefill
    needs_kv: ClassVar[bool] = False  # needs the held keys and values (PolicyState.keys / .values)
    ragged: ClassVar[bool] = False  # budgets may differ by layer or KV head (Selection.keep holds PAD)

    def validate(self, n_kept: int, n_prompt: int) -> None:
        """Raise ValueError when the hyper-parameters or the budget do not make sense together."""

    @property
    def observation_window(self) -> int:
        """Prompt queries whose rows the recorder must keep (0: none)."""
        return 0

    @property
    def query_stats_skip(self) -> int | None:
        """Leading prompt tokens left out of the prefill query statistics; None: the policy needs none."""
        return None

    @property
    def reads_queries(self) -> bool:
        """Whether the prompt's queries (a question's among them) score the entries: attention sums or rows, or
        query statistics. False for policies that decide from positions, keys or a repeat of the context alone."""
        return self.needs_colsum or self.needs_window_rows or self.query_stats_skip is not None

    @property
    def reconstruction_pass(self) -> tuple[int, int] | None:
        """(sinks in the repeat queries' softmax, context tokens per repeat pass) when the policy needs the
        context-reconstruction scores (``PolicyState.reconstruction``); None: it needs none."""
        return None

    @property
    def position_mode(self) -> str:
        """How kept keys are positioned (the page states it)."""
        return "original"

    def params(self) -> dict:
        """The hyper-parameters as a plain dict (JSON, UI, CLI)."""
        return dataclasses.asdict(self)

    def select(self, state: PolicyState) -> Selection:
        raise NotImplementedError

    def compresses(self, n_held: int, n_kept: int, step: int) -> bool:
        """Compress now? After the prefill when over budget; while decoding only if the policy evicts then."""
        return n_held > n_kept and (step == 0 or self.evicts_while_decoding)

    def wants_compression(self, state: PolicyState) -> bool:
        """:meth:`compresses` for a policy state."""
        return self.compresses(state.positions.shape[-1], state.n_kept, state.step)


def field_specs(policy_cls: type[Policy]) -> list[dict]:
    """The policy's hyper-parameters (name, type, default, help) so the UI and CLI can build controls."""
    out = []
    for f in dataclasses.fields(policy_cls):
        default = f.default if f.default is not dataclasses.MISSING else None
        out.append(
            {
                "name": f.name,
                "type": type(default).__name__ if default is not None else "str",
                "default": default,
                "help": f.metadata.get("help", ""),
                "choices": f.metadata.get("choices"),
                "min": f.metadata.get("min"),
                "max": f.metadata.get("max"),
            }
        )
    return out


def pad_ragged(per_head: list[list[torch.Tensor]], device=None) -> torch.Tensor:
    """Per layer, per KV head kept positions (1-D, ascending) → [Lyr, Hkv, k_max], PAD after each head's list."""
    k = max(int(h.numel()) for layer in per_head for h in layer)
    out = torch.full((len(per_head), len(per_head[0]), k), PAD, dtype=torch.long, device=device)
    for li, layer in enumerate(per_head):
        for hi, head in enumerate(layer):
            out[li, hi, : head.numel()] = head
    return out


def same_for_all(keep: torch.Tensor, layers: int, kv_heads: int) -> torch.Tensor:
    """Broadcast one position list [k] to every layer and KV head: [Lyr, Hkv, k]."""
    return keep.expand(layers, kv_heads, keep.shape[-1]).contiguous()
