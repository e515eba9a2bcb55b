"""Who may read a cached block: the server's and shared blocks anyone, another session's prompt no one else."""

from __future__ import annotations

import pytest
import torch

from kvviz.blocks.hashing import BlockHasher
from kvviz.engine.engine import Engine
from kvviz.engine.handle import wait_all
from kvviz.engine.prefix import SERVER, Block, PrefixStore

SECRET = "My bank PIN is 4711 and my password is hunter2-. Keep them safe for me, please."


def _store_with(owners_per_block: list[set]) -> PrefixStore:
    store = PrefixStore(capacity_bytes=10_000, block_size=2)
    hashes = BlockHasher(2)(list(range(2 * len(owners_per_block))))
    for j, (h, owners) in enumerate(zip(hashes, owners_per_block)):
        block = Block([], torch.zeros(0), (2 * j, 2 * j + 1), hashes[j - 1] if j else None, 2 * j)
        block.own(owners)
        store.cache.insert(h, 100, block)
    return store


def test_a_block_is_readable_when_the_server_two_sessions_or_the_viewer_used_it():
    store = _store_with([{SERVER}, {"alice", "bob"}, {"alice"}])
    seen = {viewer: [b.hidden for b in store.blocks(viewer, private=True).blocks] for viewer in ("alice", "eve", None)}
    assert seen == {"alice": [False, False, False], "eve": [False, False, True], None: [False, False, True]}
    hidden = store.blocks("eve", private=True).blocks[2]
    assert hidden.token_ids == () and hidden.owners == frozenset()
    assert [b.hidden for b in store.blocks("eve").blocks] == [False] * 3, "a private deployment shows everything"


def test_a_public_view_keys_every_hash_and_keeps_the_chain():
    store = _store_with([{SERVER}, {"alice"}])
    raw, seen = store.blocks().blocks, store.blocks("eve", private=True).blocks
    assert {b.block_hash for b in raw}.isdisjoint(b.block_hash for b in seen)  # no offline guess to compare with
    assert seen[1].parent == seen[0].block_hash and seen[0].parent is None
    assert [b.block_hash for b in store.blocks("bob", private=True).blocks] == [b.block_hash for b in seen]


def test_owners_stop_at_what_decides_sharing():
    block = Block([], torch.zeros(0))
    block.own(f"student {i}" for i in range(1000))  # a template block every session finds
    assert len(block.owners) == 2


@pytest.mark.slow
def test_the_engine_records_who_sent_each_prompt(lm):
    engine = Engine(lm)
    engine.warm("What is a KV cache?")  # the server's own run: the chat template's blocks
    handles = [
        engine.submit(SECRET, chat=True, max_new_tokens=2, owner="victim"),
        engine.submit("Name three colours, please, in one short line.", chat=True, max_new_tokens=2, owner="bob"),
    ]
    assert wait_all(handles, 600)
    decode = lm.tokenizer.decode
    for viewer, reads_secret in (("attacker", False), ("victim", True), ("bob", False)):
        view = engine.prefix.blocks(viewer, private=True)
        text = "".join(decode(list(b.token_ids)) for b in view.blocks)
        assert ("PIN is 471" in text or "hunter2" in text) == reads_secret, viewer
        assert "<|im_start|>system" in text  # the template every request shares stays readable
        assert any(b.hidden for b in view.blocks) != reads_secret or viewer == "victim"
    late = engine.submit(SECRET, chat=True, max_new_tokens=2, owner="bob")  # the same prompt, sent by bob too
    assert late.result() is handles[0].trace
    text = "".join(decode(list(b.token_ids)) for b in engine.prefix.blocks("attacker", private=True).blocks)
    assert "hunter2" in text, "a block two sessions sent is shared"
