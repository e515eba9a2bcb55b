"""Blocks of the live cache against hand-computed counts: a tiny hybrid model, the bundled model, a Generate trace."""

from __future__ import annotations

import pytest

from kvviz.blocks.live import prefill_table
from kvviz.blocks.table import allocations, block_table, from_trace
from kvviz.capture.loop import capture
from kvviz.capture.model_io import encode_prompt
from tests.tiny_models import tiny_model

SMOL_SLOT = 2 * 3 * 64 * 4  # bytes of one token in one SmolLM2 layer: K and V × 3 KV heads × 64 × fp32


def test_hand_computed_table():
    t = block_table([37] * 30, [37 * SMOL_SLOT] * 30, kv_heads=3, block_size=16)
    assert t.blocks_per_layer == [3] * 30 and t.blocks == 90  # ⌈37 / 16⌉ = 3 per layer
    assert t.wasted_slots == 48 - 37 == 11
    assert t.bytes_per_token == 46_080 and t.bytes_per_block == 16 * 46_080 == 737_280  # 720 KiB
    assert t.used_bytes == 37 * 46_080 and t.paged_bytes == 48 * 46_080 and t.wasted_bytes == 11 * 46_080
    assert t.layers[0].bytes_per_slot_per_head == 512
    paged, planned, context = allocations(t, planned_tokens=37 + 48, context_length=8192)
    assert paged.reserved_bytes == 2_211_840 and paged.wasted_bytes == 506_880
    assert planned.reserved_bytes == 85 * 46_080 and planned.wasted_bytes == 48 * 46_080
    assert context.reserved_bytes == 8192 * 46_080 and context.waste_share == pytest.approx(1 - 37 / 8192)
    with pytest.raises(ValueError, match="whole number"):
        block_table([3], [100], 1, 16)


def test_tiny_hybrid_model_sliding_layers_hold_fewer_blocks():
    lm = tiny_model("gemma2")  # sliding (window 8), full, sliding; 2 KV heads of 16, fp32
    t = prefill_table(lm, list(range(3, 23)), block_size=8)  # 20 tokens
    # a sliding layer keeps the last W − 1 = 7 entries: 1 block, 1 empty slot; the full layer ⌈20 / 8⌉ = 3, 4 empty
    assert [p.tokens for p in t.layers] == [7, 20, 7]
    assert t.blocks_per_layer == [1, 3, 1] and t.wasted_slots_per_layer == [1, 4, 1]
    assert [p.first_position for p in t.layers] == [13, 0, 13]
    assert [p.bytes_per_slot for p in t.layers] == [2 * 2 * 16 * 4] * 3
    assert t.wasted_slots == 4
    windows = [8, None, 8]
    _, planned, _ = allocations(t, planned_tokens=30, context_length=512, windows=windows)
    assert planned.reserved_bytes == (7 + 30 + 7) * 256  # sliding layers reserve only their window


@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_bundled_model_prefill_in_blocks(lm, block_size):
    ids = encode_prompt(lm, "Why does the KV cache grow with every token?", True)
    n = len(ids)
    t = prefill_table(lm, ids, block_size)
    full = -(-n // block_size)
    assert t.blocks_per_layer == [full] * 30 and t.wasted_slots == full * block_size - n
    assert t.bytes_per_block == block_size * 46_080  # 720 KiB at 16, measured from the fp32 tensors
    assert t.used_bytes == n * 46_080


def test_generate_trace_blocks_fill_as_tokens_arrive(lm):
    trace = capture(lm, "Name three colours.", chat=True, max_new_tokens=20)
    n = trace.n_prompt
    for step in range(len(trace.steps)):
        t = from_trace(trace, 16, step)
        held = n + step
        assert t.seen == held and t.blocks_per_layer == [-(-held // 16)] * 30
        assert t.wasted_slots == -(-held // 16) * 16 - held
    last = from_trace(trace, 16)
    assert last.used_bytes == trace.cache_bytes
