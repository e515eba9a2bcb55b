"""The selector every policy shares: scores + protected entries + budget → the kept set and each entry's role.

A policy in this contract (as kvpress's ``ScorerPress``) says two things about the entries a KV head
holds: which it keeps whatever happens (``protect``: a role code per entry, ``COMPETES`` for the
others; StreamingLLM's sinks and recent window, H2O's recent window, SnapKV's observation window)
and how much each other entry is worth (``score``; None when position alone decides). The selector
keeps every protected entry and fills the rest of the budget with the best-scoring others. Adding a
score-based policy is then one scoring function.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from kvviz.eviction.policies.base import KEPT, Policy, PolicyState, Selection

COMPETES = 0  # protect code of an entry that is kept only if its score earns it a place


def protect_ends(
    n: int, n_first: int, first_role: int, n_last: int, last_role: int, device: torch.device | None = None
) -> torch.Tensor:
    """Role codes [n]: the first ``n_first`` entries ``first_role``, the last ``n_last`` ``last_role``, the rest compete.

    Where the two overlap (everything is kept) the first entries keep ``first_role``.
    """
    roles = torch.full((n,), COMPETES, dtype=torch.long, device=device)
    if n_last > 0:
        roles[max(0, n - n_last) :] = last_role
    roles[: max(0, n_first)] = first_role
    return roles


def select_kept(
    positions: torch.Tensor,
    n_kept: int,
    protect: torch.Tensor,
    scores: torch.Tensor | None = None,
    picked_role: int = KEPT,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(keep, roles), both [..., min(n, n_kept)], positions ascending per head.

    ``positions`` [..., n] ascending; ``protect`` role codes [..., n] (or [n], the same for every head);
    ``scores`` [..., n] aligned with ``positions`` (values at protected entries are ignored). Protected
    entries are given a score above every competing one and the top ``n_kept`` are kept (kvpress's
    padding, so its tie-breaking too); kept competitors get ``picked_role``.
    """
    protect = protect.to(positions.device).expand(positions.shape)
    n = positions.shape[-1]
    if n <= n_kept:
        return positions, torch.where(protect == COMPETES, picked_role, protect)
    free = protect == COMPETES
    n_protected = int((~free).sum(-1).max())
    if n_protected > n_kept:
        raise ValueError(f"{n_protected} entries are protected but the budget keeps only {n_kept}.")
    if scores is None:
        if int((~free).sum(-1).min()) != n_kept:
            raise ValueError("Without scores the protected entries must fill the budget exactly.")
        scores = torch.zeros(positions.shape, device=positions.device)
    top = float(scores[free].max()) if bool(free.any()) else 0.0
    padded = torch.where(free.to(scores.device), scores, top + 1.0)
    slots = torch.topk(padded, n_kept, dim=-1).indices.sort(dim=-1).values.to(positions.device)
    roles = protect.gather(-1, slots)
    return positions.gather(-1, slots), torch.where(roles == COMPETES, picked_role, roles)


@dataclass
class ScorerPolicy(Policy):
    """A policy defined by what it protects and how it scores; :func:`select_kept` does the rest."""

    picked_role: ClassVar[int] = KEPT  # the role of an entry kept for its score

    def protect(self, state: PolicyState) -> torch.Tensor:
        """Role codes [n] or [Lyr, Hkv, n] for the held entries: protected ones, or ``COMPETES``."""
        raise NotImplementedError

    def score(self, state: PolicyState) -> torch.Tensor | None:
        """Worth of each held entry [Lyr, Hkv, n] (NaN where not scored), or None when position decides."""
        return None

    def select(self, state: PolicyState) -> Selection:
        scores = self.score(state)
        keep, roles = select_kept(state.positions, state.n_kept, self.protect(state), scores, self.picked_role)
        return Selection(keep=keep, roles=roles, scores=scores)
