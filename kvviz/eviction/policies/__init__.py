"""Eviction policies behind one interface, and the one registry the UI, the CLI and the tests read.

Adding a policy = one module with a dataclass subclass of :class:`~kvviz.eviction.policies.base.Policy` and
one line in ``POLICIES``.
"""

from __future__ import annotations

from kvviz.eviction.policies.base import (
    EVICTED,
    HEAVY,
    KEPT,
    ROLE_NAMES,
    SINK,
    WINDOW,
    Policy,
    PolicyState,
    Selection,
    field_specs,
    n_kept_for,
)
from kvviz.eviction.policies.full import FullCache
from kvviz.eviction.policies.h2o import H2O
from kvviz.eviction.policies.snapkv import SnapKV
from kvviz.eviction.policies.streaming_llm import StreamingLLM
from kvviz.eviction.policies.window import SlidingWindow

POLICIES: dict[str, type[Policy]] = {
    "full": FullCache,
    "streaming_llm": StreamingLLM,
    "window": SlidingWindow,
    "h2o": H2O,
    "snapkv": SnapKV,
}


def make_policy(name: str, **params) -> Policy:
    """A policy by registry name with the given hyper-parameters (unknown names/params → ValueError)."""
    if name not in POLICIES:
        raise ValueError(f"Unknown policy {name!r}; choose one of {', '.join(POLICIES)}.")
    cls = POLICIES[name]
    known = {f["name"] for f in field_specs(cls)}
    unknown = set(params) - known
    if unknown:
        raise ValueError(
            f"Policy {name!r} has no parameter(s) {', '.join(sorted(unknown))}; "
            f"its parameters are: {', '.join(sorted(known)) or 'none'}."
        )
    return cls(**params)


__all__ = [
    "EVICTED",
    "HEAVY",
    "KEPT",
    "POLICIES",
    "ROLE_NAMES",
    "SINK",
    "WINDOW",
    "FullCache",
    "H2O",
    "Policy",
    "PolicyState",
    "Selection",
    "SlidingWindow",
    "SnapKV",
    "StreamingLLM",
    "field_specs",
    "make_policy",
    "n_kept_for",
]
