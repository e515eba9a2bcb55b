"""A chat's turn n+1 starts from turn n's cache through the prefix store, on the bundled model: it reuses
exactly the tokens turn n left there (its prompt and its answer), and gives the Trace a cold run gives."""

from __future__ import annotations

import numpy as np
import pytest

from kvviz.chat.history import DROP_ANSWERS, MODEL, messages, render
from kvviz.chat.turns import turn_report
from kvviz.engine.chat_turn import held_tokens
from kvviz.engine.engine import Engine
from kvviz.engine.handle import wait_all
from tests.engine.test_engine import ARRAYS, HALF, solo

pytestmark = pytest.mark.slow

FIRST, SECOND = "What is the capital of France?", "And of Italy?"


def _turn(engine, lm, history, user, template=MODEL, n_new=24):
    ids = render(lm.tokenizer, messages(history, user), template)
    h = engine.submit(user, prompt_ids=ids, max_new_tokens=n_new, verify=True, keep_turn=True)
    assert wait_all([h], 600)
    return h.trace


def test_turn_two_reuses_exactly_what_turn_one_cached(lm):
    engine = Engine(lm)
    b = engine.prefix.block_size
    one = _turn(engine, lm, [], FIRST)
    held = one.n_prompt + one.n_generated - 1  # the last token produced was never fed: the cache holds the rest
    # the store kept the turn's whole blocks, prompt and answer, up to its reach
    assert one.turn_cached_tokens == min(held, engine.prefix.max_tokens) // b * b
    assert one.turn_cached_tokens > one.n_prompt  # answer tokens too, not only the prompt's blocks
    # every kept block is in the store under the chained hash of turn 1's own tokens
    hashes = engine.prefix.hasher(one.token_ids[: one.turn_cached_tokens])
    assert engine.prefix.cache.match(hashes) == len(hashes)

    history = [{"role": "user", "content": FIRST}, {"role": "assistant", "content": one.text}]
    two = _turn(engine, lm, history, SECOND)
    assert two.token_ids[: one.turn_cached_tokens] == one.token_ids[: one.turn_cached_tokens]
    # exactly what turn 1 left, counted
    assert two.cached_prompt_tokens == one.turn_cached_tokens, (one.n_prompt, one.n_generated, two.n_prompt)
    report = turn_report(lm.tokenizer, two, one.token_ids, one.turn_cached_tokens, 2)
    assert report.diverged is None and report.reused == one.turn_cached_tokens
    assert report.computed == two.n_prompt - one.turn_cached_tokens

    # the reused answer blocks (computed while decoding) give the Trace a cold prefill gives
    cold = solo(lm, SECOND, prompt_ids=two.token_ids[: two.n_prompt], max_new_tokens=24).trace
    assert two.token_ids == cold.token_ids
    for name in ARRAYS:
        np.testing.assert_allclose(getattr(two, name), getattr(cold, name), atol=2e-5, rtol=1e-4, err_msg=name)
    for name in HALF:
        a, c = getattr(two, name).astype(np.float32), getattr(cold, name).astype(np.float32)
        np.testing.assert_allclose(a, c, atol=2e-3, err_msg=name)
    assert two.equivalence["max_abs_logit_diff"] < 1e-3


def test_a_template_that_drops_answers_stops_reuse_at_the_first_answer_and_still_answers(lm):
    engine = Engine(lm)
    b = engine.prefix.block_size
    one = _turn(engine, lm, [], FIRST)
    history = [{"role": "user", "content": FIRST}, {"role": "assistant", "content": one.text}]
    two = _turn(engine, lm, history, SECOND, template=DROP_ANSWERS)
    report = turn_report(lm.tokenizer, two, one.token_ids, one.turn_cached_tokens, 2)
    # the model answers the new question (shown earlier answers left empty, it answered nothing)
    assert "answered nothing" not in report.verdict()
    assert report.answered and "Italy" in two.text and "Rome" in two.text, (two.text, report.verdict())
    # the answer's message is where the rewritten history leaves what turn 1 cached: its role, then its text
    assert report.diverged is not None and report.diverged < one.n_prompt
    assert two.token_ids[: report.diverged] == one.token_ids[: report.diverged]
    assert report.before.endswith("<|im_start|>") and report.was.startswith("assistant")
    assert report.now.startswith("user") and one.text not in lm.tokenizer.decode(two.token_ids[: two.n_prompt])
    assert report.reused == report.diverged // b * b < one.turn_cached_tokens
    assert "differs from the previous turn at position" in report.verdict()


def test_a_single_turn_run_keeps_no_answer_blocks(lm):
    engine = Engine(lm)
    h = engine.submit(FIRST, chat=True, max_new_tokens=24)
    assert wait_all([h], 600)
    assert h.trace.turn_cached_tokens is None and "turn_cached_tokens" not in h.trace.summary()
    stored = engine.prefix.stats()["inserted_blocks"] * engine.prefix.block_size
    assert stored == (h.trace.n_prompt - 1) // engine.prefix.block_size * engine.prefix.block_size


def test_two_chats_decoded_together_each_reuse_their_own_turn(lm):
    """Packed steps (two conversations in one forward, keys side by side in the slot store) keep each turn's
    own rows: each second turn reuses its own first turn's blocks and computes the Trace a cold run computes."""
    engine = Engine(lm, gather_s=0.5, gather_max_s=5.0)
    firsts = ["Name a large animal.", "Name a small bird."]
    ones = [
        engine.submit(q, prompt_ids=render(lm.tokenizer, messages([], q)), max_new_tokens=12, keep_turn=True)
        for q in firsts
    ]
    assert wait_all(ones, 600) and engine.counters["max_batch_seen"] == 2
    twos = []
    for q, h in zip(firsts, ones):
        history = [{"role": "user", "content": q}, {"role": "assistant", "content": h.trace.text}]
        ids = render(lm.tokenizer, messages(history, "Why?"))
        twos.append(engine.submit("Why?", prompt_ids=ids, max_new_tokens=6, keep_turn=True))
    assert wait_all(twos, 600)
    for one, two in zip(ones, twos):
        assert two.trace.cached_prompt_tokens == one.trace.turn_cached_tokens > one.trace.n_prompt
        cold = solo(lm, "Why?", prompt_ids=two.trace.token_ids[: two.trace.n_prompt], max_new_tokens=6).trace
        assert two.trace.token_ids == cold.token_ids
        np.testing.assert_allclose(two.trace.colsum, cold.colsum, atol=2e-5, rtol=1e-4)
        np.testing.assert_allclose(two.trace.prefill_colsum, cold.prefill_colsum, atol=2e-5, rtol=1e-4)


def test_a_salted_session_s_turn_two_reuses_its_own_turn_one_and_no_one_else_does(lm):
    """With per-session salts (public mode) a turn's blocks are stored under the session's salted hashes, the
    ones its next claim looks for: the chat keeps its reuse, and another session sending the same turn finds
    none of it."""
    engine = Engine(lm, session_salt=True)

    def turn(owner, history, user):
        ids = render(lm.tokenizer, messages(history, user), MODEL)
        h = engine.submit(user, owner=owner, prompt_ids=ids, max_new_tokens=12, keep_turn=True)
        assert wait_all([h], 600)
        return h.trace

    one = turn("alice", [], FIRST)
    assert one.turn_cached_tokens > one.n_prompt
    history = [{"role": "user", "content": FIRST}, {"role": "assistant", "content": one.text}]
    two = turn("alice", history, SECOND)
    assert two.cached_prompt_tokens == one.turn_cached_tokens
    assert held_tokens(engine.prefix, one.token_ids, "alice") == one.turn_cached_tokens
    assert held_tokens(engine.prefix, one.token_ids, "bob") == 0
    assert turn("bob", history, SECOND).cached_prompt_tokens == 0
