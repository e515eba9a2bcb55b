"""Memory figures: the numbers they draw are the library's, with units, and windows visibly flatten."""

from __future__ import annotations

import plotly.graph_objects as go
import pytest

from kvviz.figures import memory as fig
from kvviz.memory.estimate import estimate
from kvviz.memory.layout import cache_layout

GiB = 2**30


def test_every_figure_has_a_one_sentence_caption():
    for name in ("formula", "table", "size", "capacity", "decode", "gauge"):
        caption = fig.CAPTIONS[name]
        assert caption.endswith(".") and caption.count(". ") == 0, name


def test_formula_substitutes_the_chapter_numbers():
    layout = cache_layout("Llama-3-70B")
    text = fig.formula_markdown(layout, estimate(layout, 8192, 1))
    assert "2 × 80 layers × 8 KV heads × 128 × 2 B = **327,680 B = 320 KiB**" in text
    assert "2,684,354,560 B = 2.5 GiB" in text


def test_formula_shows_windows_and_replication():
    layout = cache_layout("gemma-2-9b")
    text = fig.formula_markdown(layout, estimate(layout, 10_000, 2, tp=16))
    assert "| 21 × sliding |" in text and "4,095 (window 4,096 − 1)" in text and "| 21 × full |" in text
    assert "× 2 (KV heads replicated over TP = 16)" in text
    assert "head_dim 256 is stated" in text


def test_formula_for_mla_and_quantized():
    layout = cache_layout("DeepSeek-V3")
    text = fig.formula_markdown(layout, estimate(layout, 131_072, kv_dtype="int4", group_size=64))
    assert "(512 + 64) × 0.5 B" in text and "scale" in text


def test_comparison_table_is_the_chapters_for_70b():
    df = fig.comparison_table(cache_layout("Llama-3-70B"), 131_072)
    rows = {r["Attention"].split()[0]: r for _, r in df.iterrows()}
    assert (rows["MHA"]["KV per token"], rows["MHA"]["131,072-token sequence"]) == ("2.5 MiB", "320 GiB")
    assert (rows["GQA"]["KV per token"], rows["GQA"]["131,072-token sequence"]) == ("320 KiB", "40 GiB")
    assert (rows["MQA"]["KV per token"], rows["MQA"]["131,072-token sequence"]) == ("40 KiB", "5 GiB")
    assert rows["GQA"]["Attention"] == "GQA (this model)" and "hypothetical" in rows["MLA"]["Attention"]


def test_mla_formula_names_a_latent_not_heads():
    """DeepSeek-V3 caches one latent per layer: the text must not call its 128 query heads KV heads."""
    layout = cache_layout("DeepSeek-V3")
    text = fig.formula_markdown(layout, estimate(layout, 131_072, tp=8))
    assert "128 KV heads" not in text and "head_dim 192" not in text and "KV heads replicated" not in text
    assert "one 512-dim latent + 64-dim RoPE key per token per layer" in text
    assert "× 8 (one latent per layer, copied on each of the 8 TP ranks): **73,685,532,672 B = 68.6 GiB**" in text
    assert "70,272 B = **68.6 KiB**" in text


def test_a_made_up_mla_row_sits_beside_the_real_one():
    df = fig.comparison_table(cache_layout("Llama-3-70B"), 131_072)
    mla = df[df["Attention"].str.startswith("MLA")].iloc[0]
    assert mla["Attention"] == "MLA (hypothetical: a latent on these 80 layers)"
    assert (mla["KV per token"], mla["131,072-token sequence"]) == ("90 KiB", "11.2 GiB")
    assert mla["per-token arithmetic"].endswith("the real MLA, DeepSeek-V3 (61 layers): 68.6 KiB")
    real = fig.comparison_table(cache_layout("DeepSeek-V3"), 131_072)
    assert "the real MLA" not in " ".join(real["per-token arithmetic"])


def test_comparison_table_deepseek_71x():
    df = fig.comparison_table(cache_layout("DeepSeek-V3"), 131_072)
    mha = df[df["Attention"].str.startswith("MHA")].iloc[0]
    assert mha["vs this model"] == "71.1×" and mha["KV per token"] == "4.8 MiB"


def test_size_vs_context_flattens_for_windows():
    layouts = [cache_layout("Llama-3-8B"), cache_layout("Mistral-7B-v0.1"), cache_layout("gpt-oss-20b")]
    f = fig.size_vs_context(layouts, contexts=[1024, 4096, 16384, 65536])
    assert isinstance(f, go.Figure)
    traces = {t.name: list(t.y) for t in f.data}
    assert len(traces) == 5  # two windowed models get a dashed no-window counterfactual
    llama = traces["Llama-3-8B (full)"]
    mistral = traces["Mistral-7B-v0.1 (sliding)"]
    assert llama[-1] == pytest.approx(4 * llama[-2]) and llama[-1] == pytest.approx(65536 * 131_072 / GiB)
    assert mistral[-1] == mistral[-2] == pytest.approx(4095 * 131_072 / GiB)  # flat past the window
    assert traces["Mistral-7B-v0.1 if every layer were full attention"][-1] == pytest.approx(llama[-1])
    assert "GiB" in f.layout.yaxis.title.text and "tokens" in f.layout.xaxis.title.text


def test_capacity_vs_context_counts():
    f = fig.capacity_vs_context(cache_layout("Llama-3-70B"), 436 * 10**9, contexts=[8192, 131_072], tp=8, mark=8192)
    assert list(f.data[0].y) == [162, 10] and list(f.data[0].text) == ["162", "10"]
    assert "436 GB" in f.layout.title.text and "GiB" in f.layout.title.text


def test_decode_time_bars_split_weights_and_kv():
    f = fig.decode_time_vs_context(
        cache_layout("Llama-3-70B"), 140 * 10**9, batch=162, bandwidth_tbps=3.35, gpus=8, contexts=[1024, 8192], tp=8
    )
    weights, kv = f.data
    assert list(weights.y) == pytest.approx([5.2239, 5.2239], abs=1e-3)
    assert kv.y[1] == pytest.approx(16.23, abs=0.01) and kv.y[0] == pytest.approx(kv.y[1] / 8)
    assert f.layout.barmode == "stack" and "ms" in f.layout.yaxis.title.text


def test_decode_time_runs_the_batch_that_fits_with_ms_labels():
    """The chapter: 162 sequences fit at 8K but only 10 at 128K; weights 5.2 ms vs KV ≈ 16 ms at 162 × 8K."""
    layout, budget = cache_layout("Llama-3-70B"), 436 * 10**9
    contexts = [1024, 8192, 131_072]
    f = fig.decode_time_vs_context(layout, 140 * 10**9, 162, 3.35, 8, contexts, tp=8, kv_budget_bytes=budget, mark=8192)
    weights, kv = f.data
    assert fig.decode_batches(layout, 162, contexts, budget, tp=8) == [162, 162, 10]
    assert list(kv.x) == ["1,024<br>× 162", "8,192<br>× 162", "131,072<br>× 10"]
    assert kv.y[2] == pytest.approx(10 * 40 * GiB / 26.8e12 * 1e3) and kv.y[2] < 17  # not 162 × 40 GiB ≈ 260 ms
    assert list(weights.text) == ["5.2 ms"] * 3 and list(kv.text) == ["2.0 ms", "16.2 ms", "16.0 ms"]
    assert list(kv.marker.opacity) == [0.45, 1.0, 0.45]  # the requested context stands out
    assert f.layout.title.text.startswith(
        "At 8,192 tokens × 162 sequences: reading the weights takes 5.2 ms, reading the KV cache 16.2 ms"
    )
    assert "the KV cache, not the weights, sets the time per token" in f.layout.title.text


def test_budget_gauge():
    f = fig.budget_gauge(int(2.5 * GiB), 10 * GiB)
    assert f.data[0].value == pytest.approx(25) and "2.5 GiB of 10 GiB" in f.data[0].title.text
    over = fig.budget_gauge(20 * GiB, 10 * GiB)
    assert over.data[0].gauge.bar.color == "#d62728"
    with pytest.raises(ValueError):
        fig.budget_gauge(1, 0)
