"""Serving under a KV budget: the bytes held never pass the budget, every request finishes, and a lossless
mode's answers are each request's solo run — for random budgets, traces and modes (a tiny random-weight
model, the replay's own code), and on the bundled model with preemptions."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvviz.capture.model_io import model_info
from kvviz.engine.budget import BudgetError, replay
from kvviz.engine.budget_ledger import LOSSY, MODES, PAGED, Ledger
from kvviz.engine.budget_trace import Request, compare_solo, prompt_ids, room_trace, solo_runs
from tests.tiny_models import tiny_model

TINY = tiny_model("llama")

requests = st.lists(
    st.builds(
        Request,
        prompt=st.text(alphabet="abcdefgh ", min_size=1, max_size=30),
        arrival=st.integers(0, 6),
        max_new_tokens=st.integers(1, 8),
        chat=st.just(False),
    ),
    min_size=1,
    max_size=5,
)


def check_replay(result: dict, budget: int, solo, mode: str) -> None:
    for step in result["steps"]:
        assert sum(step["bytes"].values()) <= budget
        assert step["tensor_bytes"] <= budget
        assert step["running"] >= 1
    assert all(q["finished"] is not None and q["answer_ids"] for q in result["requests"])
    compare_solo(result, solo)
    if mode not in LOSSY:
        assert result["summary"]["all_same_as_solo"], [q["index"] for q in result["requests"] if not q["same_as_solo"]]


@pytest.mark.slow  # twenty random replays on the tiny model: some seconds
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=requests, mode=st.sampled_from(MODES), room=st.floats(1.0, 4.0))
def test_random_budgets_hold_finish_and_answer_as_alone(reqs, mode, room):
    ids = [TINY.tokenizer(r.prompt, add_special_tokens=False)["input_ids"] for r in reqs]
    reqs = [Request(r.prompt, r.arrival, r.max_new_tokens, False, tuple(i)) for r, i in zip(reqs, ids)]
    ledger = Ledger(model_info(TINY), mode)
    budget = int(room * max(ledger.peak(len(i), r.max_new_tokens) for r, i in zip(reqs, ids)))
    result = replay(TINY, reqs, max(budget, 1024), mode)
    check_replay(result, max(budget, 1024), solo_runs(TINY, reqs), mode)


def tiny_trace() -> list[Request]:
    texts = ["abc defg hij", "abc defg xyz uv", "hello there", "abc defg hij klm"]
    return [
        Request(t, i // 2, 6, False, tuple(TINY.tokenizer(t, add_special_tokens=False)["input_ids"]))
        for i, t in enumerate(texts)
    ]


@pytest.mark.parametrize("mode", PAGED)
def test_a_tight_paged_budget_preempts_and_recomputes_to_the_same_answers(mode):
    """Three 8-token prompts (one block each, none shared) under 22 tokens' bytes: two are admitted, and
    their growth past their first block (KIVI: past 22 entries) preempts the later one."""
    reqs = [Request(f"r{i}", 0, 6, False, tuple(range(10 + 8 * i, 18 + 8 * i))) for i in range(3)]
    ledger = Ledger(model_info(TINY), mode)
    budget = 22 * ledger.per_token
    result = replay(TINY, reqs, budget, mode)
    assert result["summary"]["preemptions"] >= 1
    event = result["events"][0]
    assert f"the latest admitted, {event['preempted']}" in event["why"]
    check_replay(result, budget, solo_runs(TINY, reqs), mode)
    preempted = [q for q in result["requests"] if q["preemptions"]]
    assert preempted and all(q["recomputed_tokens"] > q["prompt_tokens"] for q in preempted)


def test_prefix_sharing_holds_the_shared_blocks_once():
    reqs = [Request(r.prompt, 0, r.max_new_tokens, False, r.ids) for r in tiny_trace()]
    budget = 10**6
    plain, shared = replay(TINY, reqs, budget, "paged"), replay(TINY, reqs, budget, "paged+prefix")
    first = shared["steps"][1]  # the first step computes the shared blocks, the next admits their readers
    assert first["bytes"]["shared"] > 0
    assert shared["summary"]["peak_bytes"] < plain["summary"]["peak_bytes"]
    assert [q["answer_ids"] for q in shared["requests"]] == [q["answer_ids"] for q in plain["requests"]]


def test_a_ledger_that_undercounts_the_tensors_is_caught(monkeypatch):
    """The per-step check reads the cache tensors: a ledger charging one block less than they hold fails it."""
    real = Ledger.private
    monkeypatch.setattr(Ledger, "private", lambda self, t: max(0, real(self, t) - self.block * self.per_token))
    with pytest.raises(BudgetError, match="cache holds"):
        replay(TINY, tiny_trace(), 10**6, "paged")


def test_a_budget_smaller_than_one_request_is_refused():
    with pytest.raises(ValueError, match="holds no request in mode contiguous-context"):
        replay(TINY, tiny_trace(), 100_000, "contiguous-context")
    with pytest.raises(ValueError, match="KV budget"):
        replay(TINY, tiny_trace(), 10, "paged")


@pytest.mark.slow
def test_the_room_under_a_tight_budget_on_the_bundled_model(lm):
    """Two students and the example, eight new tokens, a budget of exactly the first two prompts' blocks:
    their next block preempts the later one, and every answer is its solo run."""
    reqs = room_trace(students=2, waves=1, max_new_tokens=8)
    ledger = Ledger(model_info(lm), "paged")
    budget = sum(ledger.private(len(prompt_ids(lm, r))) for r in reqs[:2])
    solo = solo_runs(lm, reqs)
    result = replay(lm, reqs, budget, "paged")
    check_replay(result, budget, solo, "paged")
    assert result["summary"]["preemptions"] >= 1


def test_kivi_holds_whole_blocks_of_the_pool_filled_with_its_packed_bytes():
    """A paged store hands out whole blocks: KIVI's packed entries fill the same pool's blocks (about seven times as
    many tokens each at 2 bits with scales), its last block partly empty, never a byte count between blocks."""
    full, kivi = Ledger(model_info(TINY), "paged"), Ledger(model_info(TINY), "paged+kivi2")
    assert kivi.block_bytes == full.block_bytes == full.block * full.per_token
    for tokens in (1, 7, 8, 16, 17, 40, 100, 333):
        held, packed = kivi.private(tokens), kivi._stored(tokens)
        assert held % kivi.block_bytes == 0 and packed <= held < packed + kivi.block_bytes, tokens
        assert held <= full.private(tokens)
    # past the full-precision window, packed entries fill several tokens' blocks with one block of bytes
    assert kivi.private(333) * 4 < full.private(333)
    assert kivi.peak(8, 300) == max(kivi.private(t) for t in range(8, 309)) >= kivi.private(308)
