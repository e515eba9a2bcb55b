"""The Quantization tab's views by name: a stored analysis reaches each view by its name, whether a show-me
answers with it or the tab's first open draws it."""

from __future__ import annotations

import dataclasses

import gradio as gr
import pytest

from kvviz.lessons.objectives import KIVI
from kvviz.settings import Settings
from kvviz.ui import quant as tab
from kvviz.ui.serving.context import AppContext


@pytest.fixture
def stored(lm):
    """The tab built, and the KIVI show-me's analysis stored as named placeholders (one per field)."""
    ctx = AppContext(lm=lm, settings=Settings())
    with gr.Blocks():
        tab.build(ctx)
    key = ctx.planners["quant.button"](KIVI.values)
    names = [f.name for f in dataclasses.fields(tab.Analysis)]
    claimed, _ = ctx.store.claim(key)
    ctx.store.fulfil(claimed, tab.Analysis(*[f"the {n}" for n in names]), "start-up", 1.0)
    return ctx


def by_elem_id(components, values) -> dict:
    """A handler's answer by elem id: a ``{component: value}`` answer only names what it writes."""
    if isinstance(values, dict):
        return {c.elem_id: v for c, v in values.items()}
    return {c.elem_id: v for c, v in zip(components, values)}


def test_a_show_me_gets_each_stored_view_in_its_place(stored):
    answer = stored.answers["quant.button"]
    names = ("prompt", "chat", "layer", "head", "format", "key_axis", "value_axis", "group", "window")
    settings = [KIVI.values[f"quant.{n}"] for n in names]
    shown = by_elem_id(answer.outputs, answer.fn(None, False, *settings))
    assert shown["quant-headline"] == "the headline" and shown["quant-keys"] == "the kmap"
    assert shown["quant-values"] == "the vmap" and shown["quant-rotation-text"] == "the rotation_text"
    assert shown["quant-table"] == "the table" and shown["quant-rotated"] == "the rmap"


def test_the_first_open_draws_the_stored_analysis_by_name(stored):
    example, line = stored.examples["tab_quant"]
    entry = stored.store.entry(example.key())
    drawn = example.draw(entry.value, entry, None)
    assert {c.elem_id: v for c, v in drawn.items()}["quant-headline"] == "the headline"
    assert {c.elem_id: v for c, v in drawn.items()}["quant-layers"] == "the layers"
    assert line.elem_id == "quant-example" and set(drawn) == set(example.outputs)
