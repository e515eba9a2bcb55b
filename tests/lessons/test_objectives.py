"""The lesson: its objectives, questions and pitfalls are the chapter's, and the decode walkthrough's steps."""

from __future__ import annotations

import pytest

from kvviz.capture.loop import capture
from kvviz.examples import chapter_text
from kvviz.lessons.objectives import NOCACHE, OBJECTIVES, PITFALLS, decode_step_view
from kvviz.lessons.questions import QUESTIONS
from kvviz.memory.estimate import cache_layout, estimate
from kvviz.units import format_bytes


def test_the_lesson_is_the_chapters():
    text = chapter_text().replace("\\(", "").replace("\\)", "")
    assert [o.number for o in OBJECTIVES] == [1, 2, 3, 4, 5]
    for o in OBJECTIVES:
        assert o.chapter in text, o.chapter
        assert o.show_me and o.explanation not in text  # explained in kvviz's own words
    for q in QUESTIONS:
        assert q.question.split("?")[0] in text.replace("\n", " ")
    assert len(PITFALLS) == 8
    views = {sm.tab for o in OBJECTIVES for sm in o.show_me} | {p.show_me.tab for p in PITFALLS}
    assert {"tab_generate", "tab_memory", "tab_attention", "tab_eviction", "tab_quant", "tab_blocks"} <= views
    for sm in [s for o in OBJECTIVES for s in o.show_me] + [p.show_me for p in PITFALLS]:
        assert all("." in k for k in sm.values) and (sm.press is None or "." in sm.press)


def test_nocache_show_me_does_not_promise_a_parabola():
    """Its ~300-token prompt and 24 tokens give N ≪ L: the passes are a near-straight line dominated by N·L."""
    assert "parabola" not in NOCACHE.look_for and "N·L dominates" in NOCACHE.look_for
    assert "750×" in NOCACHE.look_for and NOCACHE.values["nocache.new_tokens"] == 24


def test_objective_3_shows_the_8k_case_beside_128k():
    """The chapter works Llama-3-70B at 8K (2.5 GiB, the context its config is set for) and at 128K (40 GiB)."""
    (obj,) = [o for o in OBJECTIVES if o.number == 3]
    shown = {}
    for sm in obj.show_me:
        layout = cache_layout(sm.values["memory.preset"])
        est = estimate(layout, sm.values["memory.context"], sm.values["memory.batch"])
        shown[sm.values["memory.context"]] = format_bytes(est.bytes_per_sequence)
        assert f"{shown[sm.values['memory.context']]} " in sm.look_for + " "
    assert shown == {8192: "2.5 GiB", 131072: "40 GiB"}
    assert cache_layout("Llama-3-70B").max_position_embeddings == 8192


@pytest.mark.slow
def test_decode_step_view(lm):
    trace = capture(lm, "Once upon a time", chat=False, max_new_tokens=4)
    spans, md = decode_step_view(trace, 0)
    assert [c for _, c in spans] == ["computed this step"] * 4 + ["predicted next"]
    assert "prefill" in md and "4 tokens per layer" in md
    spans, md = decode_step_view(trace, 2)
    assert [c for _, c in spans].count("in cache") == 5 and "fed 1 token" in md
    assert "(5 of them redundant)" in md
    # the total is over every layer: one layer holds 1/30 of it, and the text says which is which
    s = trace.steps[2]
    layers = lm.config.num_hidden_layers
    assert len(s.layer_bytes) == layers and s.cache_bytes == layers * s.layer_bytes[0]
    assert f"**6 tokens per layer** ({format_bytes(s.layer_bytes[0])} in layer 0)" in md
    assert f"**{format_bytes(s.cache_bytes)} over all {layers} layers**" in md
    assert f"per layer = {format_bytes(s.cache_bytes)}" not in md
    with pytest.raises(ValueError):
        decode_step_view(trace, 9)
    with pytest.raises(ValueError):
        decode_step_view(None, 0)


def test_needle_show_me_ticks_only_what_the_demo_shows():
    from kvviz.eviction.demos import NEEDLE_POLICIES
    from kvviz.lessons.objectives import NEEDLE

    assert NEEDLE.values["eviction.compare_policies"] == list(NEEDLE_POLICIES) == ["streaming_llm", "snapkv"]
    assert "H2O" in NEEDLE.look_for and "Compare" in NEEDLE.look_for  # says how to add the unticked one
