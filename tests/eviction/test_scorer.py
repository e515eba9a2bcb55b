"""The shared selector: protected entries always stay, the rest of the budget goes to the best scores."""

from __future__ import annotations

import pytest
import torch

from kvviz.eviction.policies import HEAVY, KEPT, SINK, WINDOW, PolicyState, make_policy
from kvviz.eviction.policies.scorer import COMPETES, ScorerPolicy, protect_ends, select_kept


def test_protect_ends_marks_the_first_and_last_entries():
    assert protect_ends(8, 2, SINK, 3, WINDOW).tolist() == [SINK, SINK, 0, 0, 0, WINDOW, WINDOW, WINDOW]
    assert protect_ends(4, 2, SINK, 3, WINDOW).tolist() == [SINK, SINK, WINDOW, WINDOW]  # overlap: sinks win


def test_protected_entries_stay_and_the_best_scores_fill_the_budget():
    positions = torch.tensor([[10, 11, 12, 13, 14, 15, 16]])
    scores = torch.tensor([[0.9, 0.1, 0.8, 0.05, 0.7, 0.0, 0.0]])  # the last two are protected: never compared
    keep, roles = select_kept(positions, 5, protect_ends(7, 0, WINDOW, 2, WINDOW), scores, HEAVY)
    assert keep.tolist() == [[10, 12, 14, 15, 16]]
    assert roles.tolist() == [[HEAVY, HEAVY, HEAVY, WINDOW, WINDOW]]


def test_each_head_chooses_on_its_own_scores():
    positions = torch.arange(6).expand(2, 6)
    scores = torch.tensor([[5.0, 0, 0, 4, 0, 0], [0, 5.0, 4, 0, 0, 0]])
    keep, _ = select_kept(positions, 3, protect_ends(6, 0, WINDOW, 1, WINDOW), scores)
    assert keep.tolist() == [[0, 3, 5], [1, 2, 5]]


def test_nothing_is_dropped_under_budget_and_roles_still_say_why():
    positions = torch.arange(4)
    keep, roles = select_kept(positions, 10, protect_ends(4, 1, SINK, 1, WINDOW), torch.zeros(4), KEPT)
    assert keep.tolist() == [0, 1, 2, 3] and roles.tolist() == [SINK, KEPT, KEPT, WINDOW]


def test_more_protected_than_the_budget_or_position_rules_that_do_not_fill_it_are_refused():
    with pytest.raises(ValueError, match="protected"):
        select_kept(torch.arange(8), 3, protect_ends(8, 2, SINK, 2, WINDOW), torch.zeros(8))
    with pytest.raises(ValueError, match="fill the budget"):
        select_kept(torch.arange(8), 4, protect_ends(8, 1, SINK, 1, WINDOW))


def test_a_new_score_based_policy_is_one_scoring_function():
    class Loudest(ScorerPolicy):
        """Keeps the newest entry and the entries nearest position 3.2 (a toy)."""

        def protect(self, state):
            return protect_ends(state.positions.shape[-1], 0, WINDOW, 1, WINDOW)

        def score(self, state):
            return -(state.positions.float() - 3.2).abs()

    sel = Loudest().select(PolicyState(positions=torch.arange(10), n_kept=3, n_prompt=10, step=0, kv_heads=1))
    assert sel.keep.tolist() == [3, 4, 9]
    assert sel.roles.tolist()[-1] == WINDOW and COMPETES not in sel.roles.tolist()


@pytest.mark.parametrize("name", ["streaming_llm", "window", "h2o", "snapkv"])
def test_the_score_based_policies_share_the_selector(name):
    assert isinstance(make_policy(name), ScorerPolicy)
    assert type(make_policy(name)).select is ScorerPolicy.select
