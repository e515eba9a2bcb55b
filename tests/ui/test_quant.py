"""Quantization tab handlers, in-process on the real model: outputs, the 2-bit headline, bad input."""

from __future__ import annotations

import re

import gradio as gr
import pytest

from kvviz.examples import needle_prompt
from kvviz.figures import quant as fig
from kvviz.settings import Settings
from kvviz.ui import quant as tab
from kvviz.ui.serving.context import AppContext

pytestmark = pytest.mark.slow  # every handler quantizes the real model's cache


def no_progress(*args, **kwargs):
    return None


@pytest.fixture(scope="module")
def ctx(lm):
    return AppContext(lm=lm, settings=Settings())


@pytest.fixture(scope="module")
def analyzed(ctx):
    """The tab's defaults: the needle prompt, layer 15, KV head 0, INT2 keys per channel, groups of 32."""
    return tab.analyze(ctx, needle_prompt(), True, 15, 0, "int2", "channel", "token", 32, 32, progress=no_progress)


def test_one_outlier_ratio_named_and_the_same_everywhere(analyzed):
    kmap, maps_md, rot_md = analyzed.kmap, analyzed.maps_text, analyzed.rotation_text
    head = re.search(r"outlier ratio (\d+\.\d)×", kmap.layout.title.text).group(1)
    assert f"outlier ratio (the largest channel's mean |x| ÷ the median channel's) **{head}×** for keys" in maps_md
    median = re.search(r"the median outlier ratio is (\d+\.\d)× for keys", maps_md).group(1)
    assert (
        "the median outlier ratio of the keys (the largest channel's mean |x| ÷ the median channel's, over " in rot_md
    )
    assert f"is **{median}×** before the turn" in rot_md
    numbers = set(
        re.findall(r"(\d+\.\d)×", kmap.layout.title.text + maps_md.split("\n\n")[0] + rot_md.splitlines()[-1])
    )
    value_ratios = re.findall(r"\*\*(\d+\.\d)×\*\* for values|(\d+\.\d)× for values", maps_md)
    after = re.search(r"\*\*(\d+\.\d)×\*\* after it", rot_md).group(1)
    assert numbers == {head, median, after} | {x for pair in value_ratios for x in pair if x}


def test_analyze_shows_maps_table_and_the_direction(ctx, analyzed):
    a = analyzed
    kmap, vmap, maps_md, headline, table = a.kmap, a.vmap, a.maps_text, a.headline, a.table
    errors, sizes, layers, rmap, rbars, rot_md = a.errors, a.sizes, a.layers, a.rmap, a.rbars, a.rotation_text
    assert "keys per channel lose" in headline and "× worse" in headline
    assert (
        "Every row scores the same first" in headline
        and "**Values at 2 bits, judged by the attention output**" in headline
    )
    assert fig.OUTPUT_VS_ANSWER in headline
    assert set(table["tokens quantized (K / V)"].iloc[:-2]) == {table["tokens quantized (K / V)"].iloc[0]}
    assert table["cache"].str.endswith(("KiB", "MiB")).all()
    assert "outlier ratio" in maps_md
    assert len(table) == len(tab.preset_schemes()) + 1 and table["scheme"].iloc[-1] == "Your scheme"
    assert kmap.data[0].z.shape[0] == ctx.info.head_dim
    assert "layer 15, KV head 0" in vmap.layout.title.text and vmap.data[0].z.shape[0] == ctx.info.head_dim
    assert [len(t.x) for t in errors.data] == [len(table)] * 3 and len(sizes.data[0].x) == len(table)
    assert len(layers.data[-1].x) == ctx.info.layers and layers.data[-1].name == "Your scheme"
    # rotation beside KIVI: the turned key map, 4 / 3 / 2 bits × three groupings, one sentence per bit width + the maps
    assert "after the Hadamard turn" in rmap.layout.title.text and rmap.data[0].z.shape == kmap.data[0].z.shape
    assert [len(t.x) for t in rbars.data] == [9] * 3
    assert [line.split("**")[1] for line in rot_md.splitlines()] == ["4 bits:", "3 bits:", "2 bits:", "The maps:"]


def test_short_prompt_says_groups_have_not_filled(ctx):
    a = tab.analyze(ctx, "Hello there", False, 0, 0, "int2", "channel", "token", 32, 0, progress=no_progress)
    assert "too short for per-channel groups" in a.headline


def test_values_text_names_the_column_that_supports_kivi():
    from types import SimpleNamespace as R

    tok, ch, both = R(value_error=0.412), R(output_error=0.20), R(value_error=0.345, output_error=0.30)
    text = tab.values_text(R(value_error=0.412), ch, both)
    assert text == fig.values_story(tok, ch, both)  # the tab shows the library's text
    assert "not supported here" in tab.values_text(tok, R(output_error=0.4), both)


@pytest.mark.parametrize(
    "args,match",
    [
        (("", True, 0, 0, "int2", "channel", "token", 32, 0), "empty"),
        (("Hi there", False, 99, 0, "int2", "channel", "token", 32, 0), "layer"),
        (("Hi there", False, 0, 0, "int5", "channel", "token", 32, 0), "format"),  # int3 is a format now
    ],
)
def test_bad_input_is_a_readable_error(ctx, args, match):
    with pytest.raises(gr.Error, match=match):
        tab.analyze(ctx, *args, progress=no_progress)


def test_generate_side_by_side_and_agreement_history(ctx):
    out = tab.generate(
        ctx,
        "What is the capital of France?",
        True,
        "INT8 per token",
        "int2",
        "channel",
        "token",
        32,
        0,
        6,
        [],
        progress=no_progress,
    )
    assert out.full_text == out.quant_text and "agreement **100 %**" in out.summary
    assert list(out.tokens.columns) == ["step", "full precision", "quantized", "same"]
    assert [c.scheme.name for c in out.history] == ["INT8 per token"]
    with pytest.raises(gr.Error, match="Max new tokens"):
        tab.generate(ctx, "Hi", True, tab.CUSTOM, "int2", "channel", "token", 32, 0, 0, [], progress=no_progress)
