"""Cross-layer KV sharing and DeepSeek sparse attention's indexer keys in the calculator: exact numbers."""

from __future__ import annotations

import pytest

from kvviz.figures.memory import comparison_table
from kvviz.memory.estimate import attention_variants, estimate, layer_groups
from kvviz.memory.layout import cache_layout
from kvviz.memory.sharing import share_kv, unshared

T = 131_072


def _rows(name: str) -> dict[str, int]:
    table = comparison_table(cache_layout(name), T, "bf16")
    return dict(zip(table["Attention"], table["bytes_per_sequence"])), dict(
        zip(table["Attention"], table["decimal GB"])
    )


def test_gemma4_e2b_like_reproduces_the_published_comparison():
    """rasbt/LLMs-from-scratch ch04/10_kv-sharing at 131,072 tokens, bf16: MHA 37.58 GB, GQA 4.70 GB,
    MHA + sharing 16.11 GB, GQA + sharing 2.01 GB (its "GQA" keeps one KV head: MQA here)."""
    sizes, shown = _rows("Gemma-4-E2B-like")
    sharing = " + KV sharing (15 of 35 layers store)"
    expected = {
        "MHA, every layer (hypothetical)": (T * 256 * 8 * 35 * 2 * 2, "37.58 GB"),
        "MQA, every layer (hypothetical)": (T * 256 * 1 * 35 * 2 * 2, "4.7 GB"),
        f"MHA{sharing} (hypothetical)": (T * 256 * 8 * 15 * 2 * 2, "16.11 GB"),
        f"MQA{sharing} (this model)": (T * 256 * 1 * 15 * 2 * 2, "2.01 GB"),
    }
    for row, (size, text) in expected.items():
        assert (sizes[row], shown[row]) == (size, text), row
    assert sizes["MHA, every layer (hypothetical)"] == 37_580_963_840
    assert sizes[f"MQA{sharing} (this model)"] == 2_013_265_920
    assert round(37_580_963_840 / 2_013_265_920, 2) == 18.67  # the source's "Ratio (MHA / GQA+sharing)"
    layout = cache_layout("Gemma-4-E2B-like")
    est = estimate(layout, T)
    assert est.bytes_per_sequence == 2_013_265_920
    groups = layer_groups(layout, est)
    assert [(g.kind, g.count, g.bytes) for g in groups] == [("full", 15, 2_013_265_920), ("shared", 20, 0)]
    assert all(layer.kv_source == 14 for layer in layout.layers[15:])


def test_layout_follows_transformers_kv_sharing_modes():
    """A hybrid Gemma-4 text config: shared layers read the last producing layer of their own type."""
    from transformers import AutoConfig

    types = ["sliding_attention", "full_attention"] * 3
    cfg = AutoConfig.for_model(
        "gemma4_text", num_hidden_layers=6, head_dim=16, global_head_dim=32, sliding_window=8, layer_types=types,
        num_kv_shared_layers=3, num_key_value_heads=2,
    )  # fmt: skip
    layout = cache_layout(cfg)
    modes = cfg.kv_sharing_modes
    assert [layer.kind == "shared" for layer in layout.layers] == [m == "reuse" for m in modes]
    assert [layer.kv_source for layer in layout.layers] == [None, None, None, 1, 2, 1]
    # global layers store global_head_dim-sized K/V, sliding ones head_dim: per token 2 × 2 × (16 + 32 + 16) × 2 B
    assert [layer.vectors for layer in layout.layers[:3]] == [((16, 4),), ((32, 4),), ((16, 4),)]
    assert estimate(layout, 4).bytes_per_token == 2 * 2 * (16 + 32 + 16) * 2


def test_mistral_large4_kv_source_layers():
    cfg = {"model_type": "llama", "num_hidden_layers": 4, "num_attention_heads": 4, "head_dim": 8}
    layout = cache_layout({**cfg, "kv_source_layers": [0, 0, 2, 2]})
    assert [layer.kv_source for layer in layout.layers] == [None, 0, None, 2]
    assert 2 * estimate(layout, 10).bytes_per_sequence == estimate(cache_layout(cfg), 10).bytes_per_sequence == 5120
    with pytest.raises(ValueError, match="must read an earlier layer"):
        cache_layout({**cfg, "kv_source_layers": [0, 2, 2, 2]})


def test_the_calculators_producing_field_shares_any_model():
    layout = cache_layout("Llama-3-8B")
    half = share_kv(layout, 16)
    assert estimate(half, 8192).bytes_per_sequence * 2 == estimate(layout, 8192).bytes_per_sequence
    assert "KV-producing layers set to 16" in half.notes[-1]
    assert unshared(half).layers == layout.layers  # sharing undone gives the config's layers back
    gemma = cache_layout("gemma-2-9b")  # sliding, full, sliding, ...: both types must have a producer
    with pytest.raises(ValueError, match="none of the first 1 .KV-producing. layers is"):
        share_kv(gemma, 1)
    assert estimate(share_kv(gemma, 2), 32_768).bytes_per_sequence == 8192 * (4095 + 32_768)
    with pytest.raises(ValueError, match="KV-producing layers"):
        share_kv(layout, 33)


def test_deepseek_v32_mla_row_carries_the_indexer_key():
    layout = cache_layout("DeepSeek-V3.2")
    assert {layer.vectors for layer in layout.layers} == {((512, 1), (64, 1), (128, 1))}
    mla = next(v for v in attention_variants(layout, T) if v.attention == "MLA")
    assert mla.actual and mla.bytes_per_token == (512 + 64 + 128) * 61 * 2 == 85_888
    assert mla.detail == "(512 + 64 + 128 indexer) × 61 layers × 2 B"
    v3 = next(v for v in attention_variants(cache_layout("DeepSeek-V3"), T) if v.attention == "MLA")
    assert mla.bytes_per_token - v3.bytes_per_token == 128 * 61 * 2  # the indexer's 15.25 KiB per token
    assert "128-dim indexer key" in layout.notes[-1]


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"per_layer_config": {"0": {"head_dim": 1e999}}}, "'head_dim' must be a whole number"),
        ({"kv_source_layers": [0, 1.5]}, "kv_source_layers entry must be a whole number"),
        ({"num_kv_shared_layers": 2}, "no layer would produce K/V"),
        ({"index_head_dim": "x"}, "'index_head_dim' must be a whole number"),
    ],
)
def test_hostile_sharing_fields_are_refused_by_name(fields, message):
    base = {"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 8}
    with pytest.raises(ValueError, match=message):
        cache_layout({**base, **fields})
