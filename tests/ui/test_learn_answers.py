"""A show-me whose button's result is at hand answers in its own click event; otherwise it presses the button."""

from __future__ import annotations

import re

import pandas as pd

from kvviz.examples import NEEDLE_ANSWER
from kvviz.lessons.objectives import CAUSAL_DECODE, FORGET_APPEND, LLAMA70, OBJECTIVES, PITFALLS, SIDE_CHANNEL
from kvviz.lessons.showme import CHAT_REUSE, DISK_TIER, KVZIP_SNAPKV, LIVE_GQA, LIVE_NOTE
from kvviz.settings import Settings
from kvviz.ui.app import TABS, build_app
from kvviz.ui.learn import by_name
from kvviz.ui.serving.context import AppContext


def button_id(sm) -> str:
    return next(f"showme-{o.number}-{j}" for o in OBJECTIVES for j, s in enumerate(o.show_me, 1) if s is sm)


def test_results_at_hand_answer_in_the_show_me_event_and_others_are_pressed(lm):
    ctx = AppContext(lm=lm, settings=Settings(max_new_tokens=64, max_prompt_tokens=1024, concurrency=1))
    demo = build_app(ctx)
    memory = ctx.answers["memory.button"]
    out = memory.fn(None, *[c.value for c in memory.inputs])  # arithmetic: always at hand
    assert out is not None and len(out) == len(memory.outputs)
    for key in ("eviction.needle", "quant.button"):  # not stored yet (nothing computed at start-up here)
        answer = ctx.answers[key]
        assert answer.fn(None, *[c.value for c in answer.inputs]) is None

    btn = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == button_id(LLAMA70))
    (click,) = [f for f in demo.fns.values() if (btn._id, "click") in f.targets]
    sent = {b._id for b in click.outputs}
    assert {c._id for c in memory.outputs} <= sent  # the calculator's outputs come with the click
    assert {c._id for c in memory.inputs} <= {b._id for b in click.inputs}  # read from the session's page


def test_every_show_me_finds_its_view_and_learn_keeps_its_place_among_the_tabs(lm):
    ctx = AppContext(lm=lm, settings=Settings(max_new_tokens=64, max_prompt_tokens=1024, concurrency=1))
    demo = build_app(ctx)
    notes = {
        b.elem_id: str(b.value)
        for b in demo.blocks.values()
        if str(getattr(b, "elem_id", None) or "").endswith("-note") and "Look for" in str(getattr(b, "value", ""))
    }
    assert len(notes) >= len(OBJECTIVES) + len(PITFALLS)
    assert not {k: v for k, v in notes.items() if "not in this build" in v.lower()}  # the Blocks pitfall included
    assert [tab.id for tab in ctx.tabs.children] == [tab_id for _, tab_id, _ in TABS]  # built last, shown in place
    assert ctx.store.planned(ctx.planners["blocks.leak_run"](SIDE_CHANNEL.values))  # its timing is stored too


def test_the_live_architecture_show_mes_answer_from_their_stored_runs_with_their_own_numbers(lm):
    """Objective 5's architectures: each run is planned at start-up; once stored, the show-me answers in its
    click event and its "Look for" line carries that run's numbers, each of them shown in the view's summary."""
    import re

    from kvviz.lessons.objectives import LIVE_MLA, LIVE_SHARING, LIVE_STATE

    ctx = AppContext(lm=lm, settings=Settings(max_new_tokens=64, max_prompt_tokens=1024, concurrency=1))
    build_app(ctx)
    (five,) = [o for o in OBJECTIVES if o.number == 5]
    assert all(any(sm is s for s in five.show_me) for sm in (LIVE_MLA, LIVE_SHARING, LIVE_STATE))
    answer, look_for = ctx.answers["memory.arch_run"], ctx.look_fors["memory.arch_run"]
    lines = {}
    for sm in (LIVE_MLA, LIVE_SHARING, LIVE_STATE):
        key = ctx.planners[sm.press](sm.values)
        values = [sm.values["memory.arch_kind"], sm.values["memory.arch_prompt"]]
        assert ctx.store.planned(key) and answer.fn(None, *values) is None and look_for(sm.values) is None
        ctx.store.run(ctx.store.claim(key)[0], "start-up")
        summary, *_ = answer.fn(None, *values)  # now stored: answered in the click event
        lines[sm.label] = line = look_for(sm.values)
        assert line and line != sm.look_for
        numbers = re.findall(r"\d[\d,]*", line)
        assert numbers and all(n in summary for n in numbers), (line, summary)
    assert "6,144 B of fixed state" in lines[LIVE_STATE.label] and "11,008 B in all" in lines[LIVE_STATE.label]
    assert "only layer 1 of the 6 grows" in lines[LIVE_SHARING.label]
    assert "320 B per token" in lines[LIVE_MLA.label] and "1,280 B" in lines[LIVE_MLA.label]


def _inputs(ctx: AppContext, sm) -> list:
    """The pressed button's inputs as the show-me sets them (the page's defaults for the rest)."""
    names = {id(c): k for k, c in ctx.components.items()}
    return [sm.values.get(names.get(id(c), ""), c.value) for c in ctx.answers[sm.press].inputs]


def _text(out: dict) -> str:
    """What a view shows of an answer, as text: its markdown and its tables' cells (not its charts)."""
    parts = []
    for value in out.values():
        if isinstance(value, str):
            parts.append(value)
        elif isinstance(value, pd.DataFrame):
            parts.append(" ".join(str(v) for v in value.to_numpy().ravel()))
    return "\n".join(parts)


NUMBER = r"\d+(?:,\d{3})*(?:\.\d+)?"  # as the browser walks read numbers (tests/browser/showme.py)
NEWEST = [CAUSAL_DECODE, FORGET_APPEND, CHAT_REUSE, DISK_TIER, KVZIP_SNAPKV, LIVE_GQA]


def test_the_newest_views_are_reached_from_learn_with_their_own_numbers(lm):
    """Objective 2's broken caches, objective 4's chat reuse and disk tier, objective 5's KVzip vs SnapKV and live GQA:
    each is planned at start-up and, once stored, answers in its click event, its "Look for" line read from that
    result with every one of its numbers shown in the view it opens (until then the line says so)."""
    ctx = AppContext(lm=lm, settings=Settings(max_new_tokens=64, max_prompt_tokens=1024, concurrency=1))
    build_app(ctx)
    where = {sm.label: o.number for o in OBJECTIVES for sm in o.show_me}
    assert [where.get(sm.label) for sm in NEWEST] == [2, 2, 4, 4, 5, 5]
    lines = {}
    for sm in NEWEST:
        key = ctx.planners[sm.press](sm.values)
        answer, look_for = ctx.answers[sm.press], ctx.look_fors[sm.press]
        assert ctx.store.planned(key) and answer.fn(None, *_inputs(ctx, sm)) is None and look_for(sm.values) is None
        assert LIVE_NOTE in sm.look_for  # the placeholder the page shows until then
        if ctx.store.entry(key).state != "done":
            ctx.store.run(ctx.store.claim(key)[0], "start-up")
        out = by_name(answer.outputs, answer.fn(None, *_inputs(ctx, sm)))
        assert {id(c) for c in out} == {id(c) for c in answer.outputs}  # every view of the button, by name
        lines[sm.label] = line = look_for(sm.values)
        shown = set(re.findall(NUMBER, _text(out)))
        numbers = re.findall(NUMBER, line)
        assert numbers and not [n for n in numbers if n not in shown], (sm.label, line, _text(out)[:600])
    assert "The ring sits at step 2, layer 0" in lines[CAUSAL_DECODE.label]
    assert "attention output does not" in lines[CAUSAL_DECODE.label]
    assert "holds 1 entry fewer" in lines[FORGET_APPEND.label]
    kvzip = lines[KVZIP_SNAPKV.label]
    assert "only the context compressed" in kvzip and kvzip.count(NEEDLE_ANSWER) >= 2  # KVzip's and the full cache's
    snapkv = kvzip.split("SnapKV", 1)[1].split(";", 1)[0]
    assert NEEDLE_ANSWER not in snapkv, kvzip  # SnapKV, with no question to vote, loses the fact
    assert "back from disk" in lines[DISK_TIER.label]
    reuse = re.search(r"the last turn read (\d+) of its (\d+) prompt tokens", lines[CHAT_REUSE.label])
    assert reuse and 0 < int(reuse[1]) < int(reuse[2]), lines[CHAT_REUSE.label]  # most of turn 2 came from turn 1
    assert "per KV head, not per query head" in lines[LIVE_GQA.label] and "512 B per token" in lines[LIVE_GQA.label]


def test_a_deployment_that_allows_fewer_new_tokens_than_a_show_me_still_builds(lm):
    # the Generate show-mes ask for 16 and 24 new tokens: a page limited to 4 builds, and those show-mes press
    # their button (whose check says why) instead of reading a stored result they may not have
    ctx = AppContext(lm=lm, settings=Settings(max_new_tokens=4, max_prompt_tokens=1024, concurrency=1))
    demo = build_app(ctx)
    notes = [b for b in demo.blocks.values() if str(getattr(b, "elem_id", None) or "").startswith("showme-")]
    assert notes
