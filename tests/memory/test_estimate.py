"""Every worked number of the source texts, each preset, and the formula's properties."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvviz.lessons.waste import forward_passes
from kvviz.memory.capacity import decode_step, find_gpu, gpu_presets, kv_budget, max_context, max_sequences
from kvviz.memory.estimate import KV_DTYPES, attention_variants, estimate, layer_groups, resolve_kv_dtype, tokens_held
from kvviz.memory.layout import PRESET_DIR, cache_layout, load_config, preset_names
from kvviz.memory.report import MemoryRequest, report
from kvviz.units import format_bytes, format_gb

KiB, MiB, GiB = 2**10, 2**20, 2**30


def shape(layers: int, kv: int, head_dim: int, q: int | None = None) -> dict:
    """A plain Llama-like config of the chapter's 'same shape' comparisons."""
    q = q or max(kv, 64)
    return {
        "model_type": "llama",
        "num_hidden_layers": layers,
        "num_attention_heads": q,
        "num_key_value_heads": kv,
        "head_dim": head_dim,
        "hidden_size": q * head_dim,
    }


# ---- the chapter: Llama-3-70B ------------------------------------------------------------------
def test_llama3_70b_per_token_is_320_kib():
    est = estimate(cache_layout("Llama-3-70B"), context=1)
    assert est.bytes_per_token == 2 * 80 * 8 * 128 * 2 == 327_680
    assert est.bytes_per_token == 320 * KiB
    assert format_bytes(est.bytes_per_token) == "320 KiB"


@pytest.mark.parametrize("context, gib, text", [(8192, 2.5, "2.5 GiB"), (131_072, 40, "40 GiB")])
def test_llama3_70b_per_sequence(context, gib, text):
    est = estimate(cache_layout("Llama-3-70B"), context=context)
    assert est.bytes_per_sequence == context * 327_680 == gib * GiB
    assert format_bytes(est.bytes_per_sequence) == text


def test_40_gib_is_half_an_80_gb_h100():
    est = estimate(cache_layout("Llama-3-70B"), context=131_072)
    assert est.bytes_per_sequence / (find_gpu("H100").memory_gb * 1e9) == pytest.approx(0.537, abs=0.001)


@pytest.mark.parametrize(
    "kv, per_token, text_token, at_128k, text_seq",
    [
        (64, int(2.5 * MiB), "2.5 MiB", 320 * GiB, "320 GiB"),  # MHA
        (8, 320 * KiB, "320 KiB", 40 * GiB, "40 GiB"),  # GQA, the real model
        (1, 40 * KiB, "40 KiB", 5 * GiB, "5 GiB"),  # MQA
    ],
)
def test_chapter_architecture_table(kv, per_token, text_token, at_128k, text_seq):
    est = estimate(cache_layout(shape(80, kv, 128)), context=131_072)
    assert est.bytes_per_token == per_token
    assert est.bytes_per_sequence == at_128k
    assert (format_bytes(est.bytes_per_token), format_bytes(est.bytes_per_sequence)) == (text_token, text_seq)


def test_variants_reproduce_the_table_for_the_real_70b():
    rows = {v.attention: v for v in attention_variants(cache_layout("Llama-3-70B"), 131_072)}
    assert rows["MHA"].bytes_per_token == 2.5 * MiB and rows["MHA"].bytes_per_sequence == 320 * GiB
    assert rows["GQA"].bytes_per_token == 320 * KiB and rows["GQA"].actual
    assert rows["MQA"].bytes_per_token == 40 * KiB and rows["MQA"].bytes_per_sequence == 5 * GiB
    assert not rows["MHA"].actual and not rows["MLA"].actual
    assert rows["GQA"].bytes_per_token * 8 == rows["MHA"].bytes_per_token  # "8× smaller than MHA"


# ---- the chapter: DeepSeek-V3 MLA ----------------------------------------------------------------
def test_deepseek_v3_mla_per_token():
    layout = cache_layout("DeepSeek-V3")
    est = estimate(layout, context=131_072)
    assert layout.attention == "MLA" and set(layout.kinds) == {"mla"}
    assert est.bytes_per_token == (512 + 64) * 61 * 2 == 70_272
    assert round(est.bytes_per_token / KiB, 1) == 68.6
    assert format_bytes(est.bytes_per_token) == "68.6 KiB"
    assert round(est.bytes_per_sequence / GiB, 1) == 8.6


def test_deepseek_v3_plain_mha_counterfactual_is_71x():
    rows = {v.attention: v for v in attention_variants(cache_layout("DeepSeek-V3"), 131_072)}
    mha = rows["MHA"].bytes_per_token
    assert mha == 128 * (192 + 128) * 61 * 2 == 4_997_120
    assert round(mha / MiB, 1) == 4.8
    assert round(mha / rows["MLA"].bytes_per_token) == 71
    assert rows["MLA"].actual and not rows["MHA"].actual


def test_mla_has_no_factor_two_and_no_heads():
    base = load_config("DeepSeek-V3")
    more_heads = {**base, "num_attention_heads": 256, "num_key_value_heads": 256}
    one = estimate(cache_layout(base), 1000).bytes_per_sequence
    assert estimate(cache_layout(more_heads), 1000).bytes_per_sequence == one
    assert one == 1000 * 61 * (512 + 64) * 2


# ---- the chapter: serving on 8 × H100 --------------------------------------------------------------
def test_budget_8x_h100():
    b = kv_budget(gpus=8, gpu_mem_gb=80, weight_bytes=140 * 10**9, reserve=0.10)
    assert b.total_mem_bytes == 640 * 10**9
    assert b.usable_bytes == 576 * 10**9
    assert b.kv_budget_bytes == 436 * 10**9
    assert round(b.kv_budget_bytes / GiB) == 406
    assert format_bytes(b.kv_budget_bytes, digits=0) == "406 GiB"


@pytest.mark.parametrize("context, sequences", [(8192, 162), (131_072, 10)])
def test_sequences_that_fit_on_8x_h100(context, sequences):
    layout = cache_layout("Llama-3-70B")
    assert max_sequences(layout, 436 * 10**9, context, "bf16", tp=8) == sequences


def test_decode_step_weights_vs_kv_and_fp8_halves_it():
    r = report(
        MemoryRequest(
            cache_layout("Llama-3-70B"),
            context=8192,
            batch=162,
            gpus=8,
            gpu_mem_gb=80,
            reserve=0.1,
            weights_gb=140,
            bandwidth_tbps=3.35,
        )
    ).decode
    assert r.bandwidth_bytes_per_s == pytest.approx(26.8e12)
    assert round(r.ms_weights, 1) == 5.2
    assert round(r.ms_kv) == 16
    assert r.kv_bytes == pytest.approx(436e9, rel=0.01)  # "KV ≈ 436 GB"
    assert r.ms_kv > 3 * r.ms_weights
    fp8 = report(
        MemoryRequest(
            cache_layout("Llama-3-70B"),
            context=8192,
            batch=162,
            kv_dtype=resolve_kv_dtype("fp8"),
            gpus=8,
            gpu_mem_gb=80,
            weights_gb=140,
            bandwidth_tbps=3.35,
        )
    ).decode
    assert fp8.ms_kv == pytest.approx(r.ms_kv / 2)
    assert fp8.ms_weights == r.ms_weights


def test_doubling_batch_doubles_kv_reads_not_weights():
    # the chapter's check question
    layout = cache_layout("Llama-3-70B")
    one = decode_step(140 * 10**9, estimate(layout, 8192, 10).total_bytes, 3.35, 8)
    two = decode_step(140 * 10**9, estimate(layout, 8192, 20).total_bytes, 3.35, 8)
    assert two.weight_bytes == one.weight_bytes and two.kv_bytes == 2 * one.kv_bytes


def test_preset_weights_are_the_chapters_140_gb():
    r = report(MemoryRequest(cache_layout("Llama-3-70B"), context=8192, gpus=8, gpu_mem_gb=80))
    assert round(r.weight_bytes / 1e9) == 141  # 70.55 B parameters × 2 bytes
    assert r.capacity.max_sequences == 162 and r.decode is None


# ---- the chapter: check question, Llama-3-8B ---------------------------------------------------------
@pytest.mark.parametrize("dtype, kib", [("bf16", 128), ("fp8", 64)])
def test_llama3_8b_per_token(dtype, kib):
    est = estimate(cache_layout("Llama-3-8B"), 1, kv_dtype=dtype)
    assert est.bytes_per_token == 2 * 32 * 8 * 128 * KV_DTYPES[dtype] // 8
    assert est.bytes_per_token == kib * KiB


# ---- the article: Qwen3-0.6B ---------------------------------------------------------------------
def test_article_qwen3_arithmetic_with_its_inputs():
    est = estimate(cache_layout(shape(28, 8, 64, q=16)), context=32_768)
    assert est.bytes_per_sequence == 2 * 28 * 8 * 64 * 2 * 32_768 == 1_879_048_192
    assert est.bytes_per_sequence == 1.75 * GiB  # the article's "≈ 1.75 GB" is binary
    assert format_bytes(est.bytes_per_sequence, digits=2) == "1.75 GiB"
    assert format_gb(est.bytes_per_sequence) == "1.88 GB"


def test_real_qwen3_config_states_head_dim_128():
    layout = cache_layout("Qwen3-0.6B")
    assert layout.head_dim == 128 and any("head_dim 128 is stated" in n for n in layout.notes)
    est = estimate(layout, context=32_768)
    assert est.bytes_per_sequence == 2 * 28 * 8 * 128 * 2 * 32_768 == 3.5 * GiB  # twice the article


# ---- the chapter: waste without a cache ------------------------------------------------------------
def test_forward_passes_chapter_and_exact():
    fp = forward_passes(1000, 1000)
    assert fp.chapter_with_cache == 2000
    assert fp.chapter_without_cache == sum(range(1000, 2001)) == 1_501_500  # ≈ 1.5 million
    assert round(fp.chapter_ratio) == 751 and abs(fp.chapter_ratio - 750) < 1
    assert fp.without_cache == sum(1000 + i for i in range(1000)) == 1_499_500
    assert fp.with_cache == 1999
    assert round(fp.ratio) == 750


def test_forward_passes_article_table():
    # "Once upon a time" (4 tokens), 4 steps: 4 + 5 + 6 + 7 tokens fed without a cache
    fp = forward_passes(4, 4)
    assert fp.without_cache == 22 and fp.with_cache == 7


# ---- presets -------------------------------------------------------------------------------------
EXPECTED = {  # bytes per token (BF16, every layer), kinds, per sequence at 32,768 tokens
    "SmolLM2-135M": (2 * 30 * 3 * 64 * 2, {"full"}, 2 * 30 * 3 * 64 * 2 * 32768),
    "Llama-3-8B": (131_072, {"full"}, 4 * GiB),
    "Llama-3-70B": (327_680, {"full"}, 10 * GiB),
    "Qwen3-0.6B": (114_688, {"full"}, 3.5 * GiB),
    "Mistral-7B-v0.1": (131_072, {"sliding"}, 4095 * 131_072),
    "gemma-2-9b": (2 * 42 * 8 * 256 * 2, {"sliding", "full"}, 21 * 8192 * (4095 + 32768)),
    "DeepSeek-V3": (70_272, {"mla"}, 70_272 * 32768),
    "gpt-oss-20b": (2 * 24 * 8 * 64 * 2, {"sliding", "full"}, 12 * 2048 * (127 + 32768)),
    "DeepSeek-V3.2": (85_888, {"mla"}, 85_888 * 32768),  # (512 + 64 + 128 indexer) × 61 layers × 2 B
    "Gemma-4-E2B-like": (15 * 2 * 256 * 2, {"full", "shared"}, 15 * 2 * 256 * 2 * 32768),  # 15 of 35 layers store
}


def test_every_preset_is_covered():
    assert sorted(EXPECTED) == preset_names()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_preset_numbers(name):
    per_token, kinds, at_32k = EXPECTED[name]
    layout = cache_layout(name)
    est = estimate(layout, 32_768)
    assert est.bytes_per_token == per_token
    assert set(layout.kinds) == kinds
    assert est.bytes_per_sequence == at_32k
    raw = json.loads((PRESET_DIR / "models" / f"{name}.json").read_text())
    assert raw["_source"]["config"] and raw["_num_parameters"] > 0


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_presets_agree_with_transformers(name):
    """Layer types, windows and parameter counts as transformers' own config class and model derive them."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.cache_utils import get_layer_types_and_kwargs

    raw = {k: v for k, v in load_config(name).items() if not k.startswith("_")}
    cfg = AutoConfig.for_model(raw.pop("model_type"), **raw)
    types, kwargs = get_layer_types_and_kwargs(cfg.get_text_config(decoder=True))
    layout = cache_layout(name)
    ours = [
        "dummy" if x.kind == "shared" else "full_attention" if x.layer_type == "mla" else x.layer_type
        for x in layout.layers
    ]
    assert ours == types
    assert [layer.window for layer in layout.layers] == [k.get("sliding_window") for k in kwargs]
    assert cache_layout(cfg).head_dim == layout.head_dim or layout.mla  # the config object reads the same
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    assert sum(p.numel() for p in model.parameters()) == layout.num_parameters


def test_gemma2_alternates_starting_with_sliding():
    layout = cache_layout("gemma-2-9b")
    assert layout.kinds[:4] == ["sliding", "full", "sliding", "full"] and layout.num_layers == 42
    assert layout.head_dim == 256  # stated; 3584 / 16 would be 224


def test_gpt_oss_windows_flatten():
    layout = cache_layout("gpt-oss-20b")
    small, big = estimate(layout, 100_000), estimate(layout, 200_000)
    sliding = [lb for lb in big.layers if lb.kind == "sliding"]
    assert {lb.tokens_held for lb in sliding} == {127}
    assert big.bytes_per_sequence - small.bytes_per_sequence == 12 * 100_000 * 2048  # only the dense half grows


# ---- reading configs the way the model does -------------------------------------------------------
def test_gpt2_naming_and_derived_head_dim():
    layout = cache_layout({"model_type": "gpt2", "n_layer": 12, "n_head": 12, "n_embd": 768})
    assert (layout.num_layers, layout.num_key_value_heads, layout.head_dim, layout.attention) == (12, 12, 64, "MHA")


def test_gpt_bigcode_multi_query():
    layout = cache_layout(
        {"model_type": "gpt_bigcode", "n_layer": 40, "n_head": 48, "n_embd": 6144, "multi_query": True}
    )
    assert layout.num_key_value_heads == 1 and layout.attention == "MQA"
    assert estimate(layout, 1).bytes_per_token == 2 * 40 * 1 * 128 * 2


def test_qwen2_unused_window_is_ignored():
    cfg = shape(28, 4, 128, q=28) | {"model_type": "qwen2", "sliding_window": 131072, "use_sliding_window": False}
    assert set(cache_layout(cfg).kinds) == {"full"}


def test_text_config_is_used_for_multimodal():
    cfg = {"model_type": "llava", "text_config": shape(32, 8, 128, q=32)}
    assert estimate(cache_layout(cfg), 1).bytes_per_token == 131_072


def test_pasted_json_and_file(tmp_path):
    text = json.dumps(shape(32, 8, 128, q=32))
    assert cache_layout(text).num_layers == 32
    (tmp_path / "config.json").write_text(text)
    assert cache_layout(tmp_path).num_layers == 32
    assert cache_layout(str(tmp_path / "config.json")).num_layers == 32


def test_loaded_model_config_object(lm):
    layout = cache_layout(lm.config)
    preset = cache_layout("SmolLM2-135M")
    assert layout.kinds == preset.kinds
    assert (layout.num_key_value_heads, layout.head_dim) == (preset.num_key_value_heads, preset.head_dim)
    assert estimate(layout, 1).bytes_per_token == estimate(preset, 1).bytes_per_token


@pytest.mark.parametrize(
    "bad, message",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        ({"num_hidden_layers": 2}, "num_attention_heads"),
        ({"num_hidden_layers": 0, "num_attention_heads": 4, "hidden_size": 64}, "num_hidden_layers.*1 … 1,024"),
        ({"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 3, "hidden_size": 64}, "multiple"),
        (
            {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64, "layer_types": ["full_attention"]},
            "one entry per layer",
        ),
        (
            {"num_hidden_layers": 1, "num_attention_heads": 4, "hidden_size": 64, "layer_types": ["weird"]},
            "cannot size",
        ),
        ("no-such-preset", "neither a preset"),
    ],
)
def test_bad_configs_raise_clear_errors(bad, message):
    with pytest.raises(ValueError, match=message):
        cache_layout(bad)


# ---- dtypes, groups, tensor parallelism ---------------------------------------------------------
@pytest.mark.parametrize("dtype, bits", list(KV_DTYPES.items()))
def test_dtypes_scale_bytes(dtype, bits):
    est = estimate(cache_layout("Llama-3-70B"), 1, kv_dtype=dtype)
    assert est.bytes_per_token == 2 * 80 * 8 * 128 * bits // 8


def test_group_overhead():
    # int4, group 32: each 128-dim vector = 64 payload bytes + 4 groups × (2-byte scale + 2-byte zero)
    est = estimate(cache_layout("Llama-3-70B"), 1, kv_dtype="int4", group_size=32)
    assert est.bytes_per_token == 2 * 80 * 8 * (64 + 4 * 4)
    int2 = estimate(cache_layout("Llama-3-70B"), 1, kv_dtype="int2", group_size=128)
    assert int2.bytes_per_token == 2 * 80 * 8 * (32 + 4)
    with pytest.raises(ValueError, match="no per-group scales"):
        resolve_kv_dtype("bf16", group_size=32)
    with pytest.raises(ValueError, match="Unknown KV dtype"):
        resolve_kv_dtype("fp6")


def test_tp_splits_without_changing_the_total():
    layout = cache_layout("Llama-3-70B")
    one, eight = estimate(layout, 8192, tp=1), estimate(layout, 8192, tp=8)
    assert eight.total_bytes == one.total_bytes and eight.per_gpu_bytes == one.total_bytes // 8


def test_tp_beyond_kv_heads_replicates():
    layout = cache_layout("Llama-3-70B")
    est = estimate(layout, 8192, tp=16)  # the chapter's pitfall: 8 KV heads, TP=16
    assert est.replication == 2 and est.total_bytes == 2 * 2.5 * GiB
    assert est.per_gpu_bytes == estimate(layout, 8192, tp=8).per_gpu_bytes  # one head per GPU either way
    with pytest.raises(ValueError, match="cannot split"):
        estimate(layout, 8192, tp=3)


def test_mla_latent_is_replicated_by_tp():
    est = estimate(cache_layout("DeepSeek-V3"), 1000, tp=8)
    assert est.replication == 8 and est.per_gpu_bytes == est.bytes_per_sequence


# ---- windows -----------------------------------------------------------------------------------
def test_window_keep_conventions():
    layer = cache_layout("Mistral-7B-v0.1").layers[0]
    assert [tokens_held(layer, t) for t in (10, 4095, 4096, 10**6)] == [10, 4095, 4095, 4095]
    assert [tokens_held(layer, t, keep="window") for t in (10, 4096, 10**6)] == [10, 4096, 4096]
    with pytest.raises(ValueError):
        tokens_held(layer, 5, keep="nope")


def test_max_context_unbounded_when_windows_cap_everything():
    assert max_context(cache_layout("Mistral-7B-v0.1"), 10 * GiB, batch=1) is None
    assert max_context(cache_layout("Mistral-7B-v0.1"), 100 * MiB, batch=1) == 100 * MiB // 131_072
    llama = cache_layout("Llama-3-8B")
    t = max_context(llama, 10 * GiB, batch=4)
    assert estimate(llama, t, 4).total_bytes <= 10 * GiB < estimate(llama, t + 1, 4).total_bytes


def test_state_layers_are_fixed_size():
    cfg = {
        "model_type": "qwen3_next",
        "num_hidden_layers": 4,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "hidden_size": 2048,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"],
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
    }
    layout = cache_layout(cfg)
    small, big = estimate(layout, 10), estimate(layout, 10_000)
    state = ((2 * 16 * 128 + 32 * 128) * 4 + 32 * 128 * 128) * 2
    assert [lb.bytes for lb in small.layers[:3]] == [state] * 3 == [lb.bytes for lb in big.layers[:3]]
    assert big.bytes_per_sequence - small.bytes_per_sequence == 9990 * 2 * 2 * 256 * 2


def test_layer_groups_sum_to_the_sequence():
    layout = cache_layout("gemma-2-9b")
    est = estimate(layout, 10_000)
    groups = layer_groups(layout, est)
    assert [(g.kind, g.count, g.tokens_held) for g in groups] == [("sliding", 21, 4095), ("full", 21, 10_000)]
    assert sum(g.bytes for g in groups) == est.bytes_per_sequence
    assert groups[0].per_token_expr == "2 × 8 KV heads × 256 × 2 B"


# ---- properties ------------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(sorted(EXPECTED)),
    context=st.integers(0, 300_000),
    batch=st.integers(1, 64),
    dtype=st.sampled_from(sorted(KV_DTYPES)),
)
def test_total_is_linear_in_batch(name, context, batch, dtype):
    layout = cache_layout(name)
    assert (
        estimate(layout, context, batch, dtype).total_bytes == batch * estimate(layout, context, 1, dtype).total_bytes
    )


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(sorted(EXPECTED)), a=st.integers(0, 200_000), b=st.integers(0, 200_000))
def test_linear_in_context_until_windows_saturate(name, a, b):
    layout = cache_layout(name)
    per_layer_a, per_layer_b = estimate(layout, a).layers, estimate(layout, b).layers
    both = estimate(layout, a + b).layers
    for la, lb, lab, spec in zip(per_layer_a, per_layer_b, both, layout.layers):
        if spec.window is None or a + b < spec.window:  # additive: f(a + b) = f(a) + f(b)
            assert lab.bytes == la.bytes + lb.bytes
        else:  # saturated at window - 1 tokens
            assert lab.tokens_held == spec.window - 1 and lab.bytes >= max(la.bytes, lb.bytes)


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(sorted(EXPECTED)), context=st.integers(1, 200_000), budget=st.integers(1, 10**12))
def test_max_sequences_is_tight(name, context, budget):
    layout = cache_layout(name)
    n = max_sequences(layout, budget, context)
    per = estimate(layout, context).total_bytes
    assert n * per <= budget < (n + 1) * per


# ---- GPUs and display ------------------------------------------------------------------------------
def test_gpu_presets():
    gpus = {g.name.split()[0]: g for g in gpu_presets().values()}
    assert {k: (g.memory_gb, g.bandwidth_tbps) for k, g in gpus.items()} == {
        "H100": (80, 3.35),
        "H200": (141, 4.8),
        "A100": (80, 2.039),
        "L4": (24, 0.3),
        "T4": (16, 0.32),
        "RTX": (24, 1.008),
    }
    assert find_gpu("rtx 4090").memory_gb == 24
    with pytest.raises(ValueError, match="Unknown GPU"):
        find_gpu("V100")


def test_weights_that_do_not_fit_raise():
    with pytest.raises(ValueError, match="do not fit"):
        kv_budget(1, 24, 141 * 10**9, 0.1)


@pytest.mark.parametrize(
    "n, binary, text",
    [
        (327_680, True, "320 KiB"),
        (2.5 * GiB, True, "2.5 GiB"),
        (512, True, "512 bytes"),
        (436e9, False, "436 GB"),
        (1_500, False, "1.5 kB"),
    ],
)
def test_format_bytes(n, binary, text):
    assert format_bytes(n, binary=binary) == text
