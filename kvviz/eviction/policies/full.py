"""The full cache: nothing is evicted (the reference every policy is compared with)."""

from __future__ import annotations

from dataclasses import dataclass

from kvviz.eviction.policies.base import KEPT, Policy, PolicyState, Selection


@dataclass
class FullCache(Policy):
    """Keeps every entry; the budget is ignored."""

    name = "full"
    title = "Full cache (no eviction)"
    paper = "—"
    summary = "Keeps every key and value: the answer every policy is compared with."

    def compresses(self, n_held: int, n_kept: int, step: int) -> bool:
        return False

    def select(self, state: PolicyState) -> Selection:
        return Selection(keep=state.positions, roles=state.positions.new_full(state.positions.shape, KEPT))
