"""The prefix store's tiers on the bundled model: blocks spilled to disk come back bit-identical, every
prompt token says where it came from, ``cached_tokens`` is the reuse the store counted, salted sessions
share nothing."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvviz.capture.generation import Generation
from kvviz.capture.options import Decode, Feed
from kvviz.capture.trace import Trace
from kvviz.engine.disk_tier import DiskTier
from kvviz.engine.engine import Engine
from kvviz.engine.handle import wait_all
from tests.engine.test_engine import solo

pytestmark = pytest.mark.slow

ALPHA, OTHERS = "Alpha " * 20, ["Beta " * 20, "Gamma " * 20, "Delta " * 20]


def _run(engine: Engine, prompt: str, new: int, **kw):
    h = engine.submit(prompt, chat=kw.pop("chat", False), max_new_tokens=new, **kw)
    assert wait_all([h], 600)
    assert h.run.error is None, h.run.error
    return h.trace


def _reused(engine: Engine) -> int:
    s = engine.snapshot()["prefix_cache"]
    return (s["hit_blocks"] + s["disk_hit_blocks"]) * s["block_size"]


def test_blocks_evicted_to_disk_come_back_bit_identical_and_labelled(lm, tmp_path):
    # memory for two blocks of SmolLM2 (~1 MiB each): the other prompts push Alpha's out, to disk
    engine = Engine(lm, prefix_cache_bytes=2 * 2**20, prefix_disk=DiskTier(tmp_path, 64 * 2**20))
    first = _run(engine, ALPHA, 2)
    assert first.prompt_sources == ["computed"] * first.n_prompt
    hashes = engine.prefix.hashes(Generation(lm, ALPHA, feed=Feed(chat=False), decode=Decode(max_new_tokens=2)))
    assert len(hashes) == 2
    kept = {h: [(k.clone(), v.clone()) for k, v in engine.prefix.cache.get(h).payload.kv] for h in hashes}
    rows = {h: engine.prefix.cache.get(h).payload.rows.clone() for h in hashes}
    for q in OTHERS:
        _run(engine, q, 2)
    assert all(h not in engine.prefix.cache and h in engine.prefix.disk for h in hashes)
    files = list(engine.prefix.disk.folder.iterdir())
    assert len(files) >= 2 and all(f.suffix == ".safetensors" for f in files)

    before = _reused(engine)
    again = _run(engine, ALPHA, 3)  # not the finished run's duplicate: another token budget
    assert again.cached_prompt_tokens == 16 and again.prompt_sources[:16] == ["disk"] * 16
    assert again.prompt_sources[16:] == ["computed"] * (again.n_prompt - 16)
    usage = again.summary()["usage"]["prompt_tokens_details"]
    assert usage["cached_tokens"] == usage["disk_tokens"] == 16 == _reused(engine) - before
    for h in hashes:  # back in memory, the very bits that were spilled
        payload = engine.prefix.cache.get(h).payload
        assert all(torch.equal(a, k) and torch.equal(b, v) for (a, b), (k, v) in zip(payload.kv, kept[h]))
        assert torch.equal(payload.rows, rows[h])
    cold = solo(lm, ALPHA, chat=False, max_new_tokens=3).trace
    assert again.token_ids == cold.token_ids
    np.testing.assert_allclose(again.colsum, cold.colsum, atol=2e-5, rtol=1e-4)


def test_a_tampered_disk_block_is_recomputed(lm, tmp_path):
    engine = Engine(lm, prefix_cache_bytes=2 * 2**20, prefix_disk=DiskTier(tmp_path, 64 * 2**20))
    _run(engine, ALPHA, 2)
    for q in OTHERS:
        _run(engine, q, 2)
    first = engine.prefix.hashes(Generation(lm, ALPHA, feed=Feed(chat=False), decode=Decode(max_new_tokens=2)))[0]
    path = engine.prefix.disk.path(first)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    again = _run(engine, ALPHA, 3)
    assert again.cached_prompt_tokens == 0 and set(again.prompt_sources) == {"computed"}
    assert engine.snapshot()["prefix_cache"]["disk_refused_files"] == 1
    assert again.token_ids == solo(lm, ALPHA, chat=False, max_new_tokens=3).trace.token_ids


def test_cached_tokens_is_the_reuse_the_store_counted_and_the_sources_round_trip(lm, tmp_path):
    engine = Engine(lm)
    _run(engine, "What is two plus two?", 2, chat=True)
    before = _reused(engine)
    t = _run(engine, "Name a large animal.", 2, chat=True)
    details = t.summary()["usage"]["prompt_tokens_details"]
    assert details["cached_tokens"] == _reused(engine) - before == t.cached_prompt_tokens >= 16
    assert details["memory_tokens"] == details["cached_tokens"] and details["disk_tokens"] == 0
    assert details["computed_tokens"] == t.n_prompt - details["cached_tokens"]
    loaded = Trace.load(t.save(tmp_path / "t.npz"))
    assert loaded.prompt_sources == t.prompt_sources and loaded.usage() == t.usage()


def test_runs_without_a_recorder_reuse_keys_and_values_on_their_own(lm):
    engine = Engine(lm)
    text = "The cache keeps keys and values so that each new token reads them. " * 8
    a = _run(engine, text + "One.", 2, record=False)
    b = _run(engine, text + "Two.", 2, record=False)
    assert a.cached_prompt_tokens == 0 and b.cached_prompt_tokens >= 64
    assert b.token_ids == solo(lm, text + "Two.", chat=False, max_new_tokens=2).trace.token_ids
    recorded = _run(engine, text + "Three.", 2)  # a recorded run needs rows: the rows-free blocks are not its
    assert recorded.cached_prompt_tokens == 0


def _owners(engine: Engine) -> list[frozenset]:
    return [b.owners for b in engine.prefix.blocks().blocks]


def test_salted_sessions_never_share_a_block_unsalted_ones_do(lm):
    questions = ["What is two plus two?", "Name a large animal."]
    plain = Engine(lm)
    a = _run(plain, questions[0], 2, chat=True, owner="alice")
    b = _run(plain, questions[1], 2, chat=True, owner="bob")
    same = _run(plain, questions[0], 2, chat=True, owner="bob")  # alice's very request: one run for both
    assert a.cached_prompt_tokens == 0 and b.cached_prompt_tokens >= 16 and same is not None
    assert any({"alice", "bob"} <= o for o in _owners(plain)) and plain.counters["shared"] == 1

    salted = Engine(lm, session_salt=True)
    a = _run(salted, questions[0], 2, chat=True, owner="alice")
    b = _run(salted, questions[1], 2, chat=True, owner="bob")
    same = _run(salted, questions[0], 2, chat=True, owner="carol")  # alice's very request, from a third session
    assert a.cached_prompt_tokens == b.cached_prompt_tokens == same.cached_prompt_tokens == 0
    assert salted.counters["shared"] == 0  # not even a finished run is handed to another session
    assert all(len(o) == 1 for o in _owners(salted))
    own = _run(salted, questions[1], 3, chat=True, owner="alice")  # a session still reuses its own blocks
    assert own.cached_prompt_tokens >= 16
