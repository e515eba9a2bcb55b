"""The live prefix-cache figures: pure functions of a store view, with the tree, the rows and the units right."""

from __future__ import annotations

import pytest

from kvviz.engine.prefix import BlockInfo, StoreView
from kvviz.figures import blocks_room as fig

STATS = {
    "block_size": 16,
    "blocks": 3,
    "bytes_held": 3 * 2**20,
    "capacity_bytes": 256 * 2**20,
    "requests": 4,
    "queried_blocks": 8,
    "hit_blocks": 2,
    "hit_rate": 0.25,
    "evicted_blocks": 1,
    "evicted_bytes": 2**20,
}


def view() -> StoreView:
    ids = tuple(range(16))
    blocks = [
        BlockInfo("bb" * 32, "aa" * 32, 16, ids, 0, 0, 2**20),  # a question, after the template
        BlockInfo("cc" * 32, "dd" * 32, 32, ids, 0, 0, 2**20),  # its parent was evicted
        BlockInfo("aa" * 32, None, 0, ids, 2, 2, 2**20),  # the template, held by two runs
    ]
    return StoreView(blocks, STATS)


TEXTS = ["What is two\nplus two?", "tail", "<|im_start|>system\nYou are a helpful AI assistant"]


def test_summary_says_hit_rate_bytes_and_evictions():
    text = fig.room_summary(view())
    assert "**3 blocks** of 16 tokens cached" in text and "**3 MiB of 256 MiB** (1%)" in text
    assert "2 held by running requests" not in text and "1 held by running requests" in text
    assert "**Hit rate 25%**: 2 of 8 looked-up prompt blocks" in text and "4 requests" in text
    assert "32 prompt tokens not recomputed" in text and "**1 block evicted** so far" in text
    empty = fig.room_summary(StoreView([], dict(STATS, blocks=0)))
    assert "No blocks yet" in empty


def test_tree_hangs_each_block_under_the_one_it_follows():
    tree = fig.room_tree(view(), TEXTS).data[0]
    parents = dict(zip(tree.ids, tree.parents))
    assert parents["aa" * 32] == fig.ROOT and parents["bb" * 32] == "aa" * 32
    assert parents["cc" * 32] == fig.GONE and parents[fig.GONE] == fig.ROOT
    colours = dict(zip(tree.ids, tree.marker.colors))
    assert colours["aa" * 32] == fig.IN_USE and colours["bb" * 32] == fig.CACHED
    label = dict(zip(tree.ids, tree.labels))["aa" * 32]
    assert "⏎" in label and len(label) <= 28 and label.endswith("…")
    assert "held by 2 running requests · 2 hits · 1 MiB" in dict(zip(tree.ids, tree.hovertext))["aa" * 32]
    assert fig.room_tree(StoreView([], STATS), []).layout.title.text == "No blocks cached yet"
    with pytest.raises(ValueError, match="one text per block"):
        fig.room_tree(view(), TEXTS[:1])


def test_table_lists_blocks_next_to_evict_first():
    table = fig.room_table(view(), TEXTS)
    assert list(table["evicted"]) == ["#1", "#2", "not while held"]
    assert list(table["block"]) == ["bbbbbbbb", "cccccccc", "aaaaaaaa"]
    assert list(table["after"]) == ["aaaaaaaa", "dddddddd", "—"]
    assert list(table["tokens"]) == ["16–31", "32–47", "0–15"]
    assert table["text"][0] == "What is two⏎plus two?" and list(table["held by"]) == [0, 0, 2]
    assert list(table["hits"]) == [0, 0, 2] and set(table[fig.ROWS_BYTES]) == {"1 MiB"}
