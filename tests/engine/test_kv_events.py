"""The prefix store's KV events in vLLM's schema: replaying them rebuilds exactly the cached blocks; a log vLLM
wrote rebuilds its tree; a long log folds itself and still replays exactly; a public export hides tokens."""

from __future__ import annotations

import json

import pytest
import torch

from kvviz.blocks.hashing import BlockHasher
from kvviz.engine.disk_tier import DiskTier
from kvviz.engine.engine import Engine
from kvviz.engine.handle import wait_all
from kvviz.engine.kv_events import KVEventLog, replay
from kvviz.engine.prefix import Block, PrefixStore

PROMPTS = ["Alpha " * 20, "Beta " * 20, "Alpha " * 12 + "Gamma " * 8, "Delta " * 20, "Alpha " * 20]


def _cached(store: PrefixStore) -> set[tuple]:
    return {(b.block_hash, b.parent, b.start, b.token_ids) for b in store.blocks().blocks}


def _replayed(text: str) -> set[tuple]:
    return {(b.block_hash, b.parent, b.start, b.token_ids) for b in replay(text)}


def _payload(ids: tuple[int, ...], parent: bytes | None, start: int) -> Block:
    return Block([], torch.zeros(0), ids, parent, start)


@pytest.mark.slow
def test_replaying_the_exported_events_rebuilds_exactly_the_cached_blocks(lm, tmp_path):
    # memory for two blocks of SmolLM2 (~1 MiB each): later prompts evict earlier blocks, to disk and back
    engine = Engine(lm, prefix_cache_bytes=2 * 2**20, prefix_disk=DiskTier(tmp_path, 64 * 2**20))
    store = engine.prefix
    for prompt in PROMPTS:
        h = engine.submit(prompt, chat=False, max_new_tokens=2)
        assert wait_all([h], 600) and h.run.error is None
        assert _replayed(store.kv_events()) == _cached(store)
    text = store.kv_events()
    kinds = [e["type"] for line in text.splitlines() for e in json.loads(line)["events"]]
    assert "BlockRemoved" in kinds and kinds.count("BlockStored") > len(store.blocks().blocks)
    first = json.loads(text.splitlines()[0])
    assert set(first) == {"ts", "events"}
    assert set(first["events"][0]) == {
        "type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"
    }  # fmt: skip
    assert first["events"][0]["medium"] == "GPU" and first["events"][0]["block_size"] == store.block_size
    engine.close()
    store.close()
    assert replay(store.kv_events()) == []  # AllBlocksCleared


def test_a_long_log_folds_itself_and_still_replays_exactly():
    store = PrefixStore(capacity_bytes=300, block_size=2)
    store.cache.log = KVEventLog(limit=5)
    hasher = BlockHasher(2)
    for n in range(6):
        ids = [n, n + 1, n + 2, n + 3]
        a, b = hasher(ids)
        held = [store.cache.insert(a, 100, _payload(tuple(ids[:2]), None, 0))]
        held.append(store.cache.insert(b, 100, _payload(tuple(ids[2:]), a, 2)))
        store.cache.release(held)
    assert len(store.cache.log.events()) <= 6
    assert _replayed(store.kv_events()) == _cached(store) and len(_cached(store)) == 3


VLLM_LOG = [  # what vLLM's publisher sends, as JSON: integer hashes, several blocks per event, another medium
    {"ts": 1.0, "events": [{"type": "BlockStored", "block_hashes": [11, 12], "parent_block_hash": None,
                            "token_ids": [1, 2, 3, 4, 5, 6, 7, 8], "block_size": 4, "lora_id": None,
                            "medium": "GPU", "lora_name": None}]},
    {"ts": 2.0, "events": [{"type": "BlockStored", "block_hashes": [13], "parent_block_hash": 11,
                            "token_ids": [9, 9, 9, 9], "block_size": 4, "lora_id": None, "medium": "GPU",
                            "lora_name": None},
                           {"type": "BlockStored", "block_hashes": [99], "parent_block_hash": None,
                            "token_ids": [0, 0, 0, 0], "block_size": 4, "lora_id": None, "medium": "CPU",
                            "lora_name": None}]},
    {"ts": 3.0, "events": [{"type": "BlockRemoved", "block_hashes": [12], "medium": "GPU"}]},
]  # fmt: skip


def test_a_log_vllm_wrote_rebuilds_its_prefix_tree():
    text = "\n".join(json.dumps(batch) for batch in VLLM_LOG)
    blocks = {b.block_hash: b for b in replay(text)}
    assert set(blocks) == {"11", "13"}  # 12 removed; 99 lives on another medium
    assert blocks["13"].parent == "11" and blocks["13"].start == 4 and blocks["13"].token_ids == (9, 9, 9, 9)
    assert blocks["11"].token_ids == (1, 2, 3, 4) and blocks["11"].start == 0
    bare = "\n".join(json.dumps(e) for batch in VLLM_LOG for e in batch["events"])  # one event per line
    assert replay(bare) == replay(text)
    with pytest.raises(ValueError, match="Line 1"):
        replay('{"type": "Something"}')


def test_a_public_export_keys_hashes_and_withholds_another_sessions_tokens():
    store = PrefixStore(capacity_bytes=1000, block_size=2)
    a, b = BlockHasher(2)([1, 2, 3, 4])
    mine = store.cache.insert(a, 100, _payload((1, 2), None, 0))
    mine.payload.own(["alice"])
    theirs = store.cache.insert(b, 100, _payload((3, 4), a, 2))
    theirs.payload.own(["bob"])
    events = [json.loads(line)["events"][0] for line in store.kv_events("alice", private=True).splitlines()]
    assert [e["token_ids"] for e in events] == [[1, 2], []]
    assert a.hex() not in json.dumps(events) and b.hex() not in json.dumps(events)
    assert events[1]["parent_block_hash"] == events[0]["block_hashes"][0]  # the tree survives keying
