"""The prefix store's view for the Blocks tab: a consistent, tensor-free copy of every cached block."""

from __future__ import annotations

import threading

import pytest
import torch

from kvviz.blocks.hashing import BlockHasher
from kvviz.capture.attention_fn import installed
from kvviz.capture.generation import Generation
from kvviz.capture.model_io import forward
from kvviz.capture.options import Decode, Feed
from kvviz.engine.engine import Engine
from kvviz.engine.handle import wait_all
from kvviz.engine.prefix import Block, PrefixStore

QUESTIONS = ["What is two plus two?", "Name a large animal."]


def _payload(ids: tuple[int, ...], parent: bytes | None, start: int) -> Block:
    return Block([], torch.zeros(0), ids, parent, start)


def test_blocks_lists_every_block_with_its_chain_in_eviction_order():
    store = PrefixStore(capacity_bytes=1000, block_size=2)
    first, second = BlockHasher(2)([1, 2, 3, 4])
    held = [store.cache.insert(first, 100, _payload((1, 2), None, 0))]
    held.append(store.cache.insert(second, 100, _payload((3, 4), first, 2)))
    view = store.blocks()
    assert [b.block_hash for b in view.blocks] == [first.hex(), second.hex()]
    assert view.blocks[1].parent == first.hex() and view.blocks[0].parent is None
    assert view.blocks[1].token_ids == (3, 4) and view.blocks[1].start == 2
    assert all(b.ref_count == 1 and b.hits == 0 and b.nbytes == 100 for b in view.blocks)
    assert view.stats["blocks"] == 2 and view.stats["bytes_held"] == 200 and view.stats["capacity_bytes"] == 1000
    store.cache.release(held)  # tail first
    assert [b.block_hash for b in store.blocks().blocks] == [second.hex(), first.hex()]
    assert all(b.ref_count == 0 for b in store.blocks().blocks)


def test_blocks_waits_for_the_engine_thread_to_finish_its_change():
    store = PrefixStore(capacity_bytes=1000, block_size=2)
    got = []
    with store.lock:  # as the engine thread holds it while inserting
        reader = threading.Thread(target=lambda: got.append(store.blocks()))
        reader.start()
        reader.join(0.2)
        assert reader.is_alive() and not got, "read while the cache was being changed"
        store.cache.insert(b"k" * 32, 100, _payload((7, 8), None, 0))
    reader.join(5)
    assert len(got) == 1 and len(got[0].blocks) == 1


@pytest.mark.slow
def test_blocks_held_by_a_running_request_count_it(lm):
    store = PrefixStore(256 * 2**20)
    g = Generation(lm, QUESTIONS[0], feed=Feed(chat=True), decode=Decode(max_new_tokens=1))
    claim = store.claim(g)
    with torch.inference_mode(), installed(lm.model):
        ids, start = g.next_feed()
        g.take(forward(lm, ids, start, g.cache, g.rec)[-1], len(ids))
    store.store(g, claim)
    view = store.blocks()
    assert view.blocks and all(b.ref_count == 1 for b in view.blocks)
    store.release(claim)
    g.release()
    assert all(b.ref_count == 0 for b in store.blocks().blocks)


@pytest.mark.slow
def test_two_engine_runs_share_the_chat_template_blocks(lm):
    engine = Engine(lm)
    assert engine.prefix is not None
    a = engine.submit(QUESTIONS[0], chat=True, max_new_tokens=2)
    assert wait_all([a], 600)
    b = engine.submit(QUESTIONS[1], chat=True, max_new_tokens=2)
    assert wait_all([b], 600)
    store = engine.prefix
    size = store.block_size
    full = [store.hasher(h.trace.token_ids[: (h.trace.n_prompt - 1) // size * size]) for h in (a, b)]
    shared = b.trace.cached_prompt_tokens // size
    assert shared >= 1 and full[0][:shared] == full[1][:shared]
    view = store.blocks()
    by_hash = {blk.block_hash: blk for blk in view.blocks}
    assert set(by_hash) == {h.hex() for h in full[0] + full[1]}
    assert all(blk.ref_count == 0 for blk in view.blocks), "both runs are over"
    ids = a.trace.token_ids
    for j, h in enumerate(full[0]):
        blk = by_hash[h.hex()]
        assert blk.hits == (1 if j < shared else 0)
        assert blk.start == size * j and blk.token_ids == tuple(ids[size * j : size * (j + 1)])
        assert blk.parent == (None if j == 0 else full[0][j - 1].hex())
    template = lm.tokenizer.decode(list(by_hash[full[0][0].hex()].token_ids))
    assert template.startswith("<|im_start|>system")
    # b released last, tail first: the template's first block is the most recently used
    assert view.blocks[-1].block_hash == full[0][0].hex()
    assert view.stats["hit_blocks"] == shared and view.stats["requests"] == 2 and view.stats["evicted_blocks"] == 0
