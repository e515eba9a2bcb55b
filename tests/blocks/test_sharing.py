"""Prefix sharing by chained hash against hand-computed cases, then on the bundled model's chat prompts."""

from __future__ import annotations

from kvviz.blocks.hashing import common_prefix
from kvviz.blocks.live import share_prompts
from kvviz.blocks.sharing import share
from kvviz.blocks.table import block_table
from kvviz.capture.model_io import encode_prompt

SLOT = 46_080  # one token in every SmolLM2 layer, fp32


def table(n: int, b: int = 16):
    return block_table([n] * 30, [n * SLOT // 30] * 30, 3, b)


def test_two_prompts_share_the_full_blocks_of_their_common_prefix():
    a = list(range(40))  # blocks 0–15, 16–31 full; 32–39 partial
    b = list(range(35)) + [99] * 10  # 45 tokens, same first 35
    s = share([a, b], [table(40), table(45)])
    assert s.shared_blocks == 35 // 16 == 2
    assert [p.block_ids for p in s.prompts] == [(0, 1, 2), (0, 1, 3)]
    assert [p.cached_blocks for p in s.prompts] == [0, 2]
    assert s.physical_blocks == 4 and s.logical_blocks == 6 and s.ref_counts == {0: 2, 1: 2, 2: 1, 3: 1}
    assert s.bytes_per_block == 16 * SLOT and s.bytes_saved == 2 * 16 * SLOT
    assert s.prefill_tokens_saved == 32 and s.stats.hit_rate == 2 / 4  # 2 of the 4 blocks looked up


def test_equal_tokens_after_a_different_prefix_are_not_shared():
    a = list(range(32))
    b = [7] + list(range(1, 32))  # differs in token 0 only
    s = share([a, b], [table(32), table(32)])
    assert s.shared_blocks == 0 and s.cached_blocks == 0 and s.physical_blocks == 4


def test_the_last_token_is_always_computed():
    a = list(range(32))
    s = share([a, list(a)], [table(32), table(32)])
    assert s.shared_blocks == 2  # the whole prompt is common...
    assert s.prompts[1].cached_blocks == 1  # ...but the block holding the last token is recomputed
    assert s.prompts[1].block_ids == (0, 2) and s.bytes_saved == 16 * SLOT


def test_three_prompts_reuse_what_any_earlier_one_computed():
    a = list(range(48))
    b = list(range(32)) + [5] * 20
    c = list(range(16)) + [9] * 40
    s = share([a, b, c], [table(48), table(52), table(56)], names=["A", "B", "C"])
    assert s.shared_blocks == 1  # common to all three: tokens 0–15
    assert [p.cached_blocks for p in s.prompts] == [0, 2, 1]
    assert s.prefill_tokens_saved == 48 and [p.name for p in s.prompts] == ["A", "B", "C"]


def test_two_students_on_the_bundled_model(lm):
    texts = [
        "Student 1 asks: why does the KV cache grow with every token?",
        "Student 2 asks: what is a paged KV cache and why does vLLM use blocks?",
    ]
    ids = [encode_prompt(lm, t, True) for t in texts]
    common = common_prefix(ids)  # the chat template's system prompt and the shared words
    s = share_prompts(lm, ids, block_size=8)
    assert s.shared_blocks == common // 8 >= 2
    assert s.prompts[1].cached_blocks == s.shared_blocks
    assert s.bytes_per_block == 8 * SLOT  # measured from the first prompt's cache tensors
    assert s.bytes_saved == s.shared_blocks * 8 * SLOT
    assert [p.table.seen for p in s.prompts] == [len(i) for i in ids]
