"""Deep links: a URL's tab and settings are checked against the controls; hostile values become notes."""

from __future__ import annotations

import gradio as gr
import pytest

from kvviz.ui.page.deeplinks import make_link, note_text, parse_link

TAB_IDS = ["tab_generate", "tab_attention", "tab_eviction", "tab_memory"]


@pytest.fixture(scope="module")
def components():
    with gr.Blocks():
        return {
            "memory.preset": gr.Dropdown(["Llama-3-70B", "DeepSeek-V3"], value="Llama-3-70B"),
            "memory.context": gr.Number(8192),
            "memory.batch": gr.Number(1),
            "eviction.policy": gr.Dropdown([("SnapKV", "snapkv"), ("H2O", "h2o")], value="snapkv"),
            "eviction.budget": gr.Number(64),
            "attention.layer": gr.Slider(0, 29, value=20, step=1),
            "attention.head": gr.Dropdown([(f"q{h}", h) for h in range(9)], value=0),
        }


def test_a_memory_link_sets_the_tab_and_its_controls(components):
    link = parse_link({"tab": "memory", "config": "DeepSeek-V3", "context": "131072"}, components, TAB_IDS)
    assert link.tab == "tab_memory"
    assert link.values == {"memory.preset": "DeepSeek-V3", "memory.context": 131072}
    assert link.notes == []


def test_eviction_and_attention_links(components):
    ev = parse_link({"tab": "eviction", "policy": "snapkv", "budget": "128"}, components, TAB_IDS)
    assert ev.values == {"eviction.policy": "snapkv", "eviction.budget": 128} and not ev.notes
    at = parse_link({"tab": "attention", "layer": "20", "head": "3"}, components, TAB_IDS)
    assert at.values == {"attention.layer": 20, "attention.head": 3} and not at.notes


@pytest.mark.parametrize(
    "query, fragment",
    [
        ({"tab": "memory", "context": "1e99"}, "outside the allowed range"),
        ({"tab": "memory", "context": "nan"}, "context"),
        ({"tab": "memory", "batch": "-3"}, "batch"),
        ({"tab": "memory", "config": "<script>alert(1)</script>"}, "not one of the choices"),
        ({"tab": "attention", "layer": "99"}, "outside the allowed range"),
        ({"tab": "attention", "layer": "2.5"}, "whole number"),
        ({"tab": "attention", "head": "9"}, "not one of the choices"),
        ({"tab": "eviction", "budget": "0"}, "outside the allowed range"),
        ({"tab": "eviction", "budget": "x" * 10_000}, "longer than"),
        ({"tab": "../../etc/passwd"}, "not a view"),
        ({"tab": "memory", "layer": "3"}, "not a setting of the memory view"),
        ({"budget": "128"}, "without a known tab"),
    ],
)
def test_hostile_values_are_left_out_with_a_note(components, query, fragment):
    link = parse_link(query, components, TAB_IDS)
    assert not link.values
    assert any(fragment in n for n in link.notes), link.notes
    assert note_text(link.notes).startswith("<p>⚠")


def test_valid_parts_of_a_half_bad_link_still_apply(components):
    link = parse_link({"tab": "memory", "config": "DeepSeek-V3", "context": "inf"}, components, TAB_IDS)
    assert link.values == {"memory.preset": "DeepSeek-V3"} and len(link.notes) == 1


def test_make_link_round_trips_through_parse(components):
    url = make_link(
        "http://host/",
        "tab_memory",
        {"memory.preset": "DeepSeek-V3", "memory.context": 131072.0, "memory.batch": 4, "eviction.budget": 9},
    )
    assert url == "http://host/?tab=memory&config=DeepSeek-V3&context=131072&batch=4"
    query = dict(p.split("=") for p in url.split("?")[1].split("&"))
    assert parse_link(query, components, TAB_IDS).values["memory.context"] == 131072
    assert make_link("http://host/", None, {}) == "http://host/"


@pytest.mark.parametrize(
    "query, shown",
    [
        ({"tab": "[log in again](http://evil.example/login)"}, "[log in again](http://evil"),
        ({"tab": "![a](http://evil.example/px.png)"}, "![a](http://evil.example/px.png)"),
        ({"tab": "<img src=http://evil.example/px.png>"}, "<img src=http://evil.example"),
        ({"tab": "memory", "<b style=color:red;font-size:99px>X</b>": "1"}, "<b style=color:red;font-size"),
        ({"tab": "memory", "config": "<script>alert(1)</script>"}, "<script>alert(1)</script>"),
    ],
)
def test_a_link_s_text_is_plain_text_in_the_note(components, query, shown):
    """The note is HTML in which only its own lead-in is markup: every character of the link is text."""
    from html.parser import HTMLParser

    class Tags(HTMLParser):
        def __init__(self):
            super().__init__()
            self.tags, self.text = [], ""

        def handle_starttag(self, tag, attrs):
            self.tags.append((tag, attrs))

        def handle_data(self, data):
            self.text += data

    parsed = Tags()
    parsed.feed(note_text(parse_link(query, components, TAB_IDS).notes))
    assert parsed.tags == [("p", []), ("strong", [])]
    assert shown in parsed.text, parsed.text
