"""The Generate tab's chat: ``/chat``'s history refused quickly when hostile, and two turns through the
tab's own steps (the request check, the engine, the conversation state and its views)."""

from __future__ import annotations

import json
import time

import gradio as gr
import pytest

from kvviz.chat.turns import TurnReport
from kvviz.limits import MAX_HISTORY_CHARS, MAX_HISTORY_MESSAGES
from kvviz.settings import Settings
from kvviz.ui.generate import chat
from kvviz.ui.generate import run as generate_run
from kvviz.ui.generate.views import Form
from kvviz.ui.serving.context import AppContext

PAIR = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]


def _nested(depth: int) -> list:
    """[[[…]]] ``depth`` lists deep, built without recursion (as a JSON parser would hand it over)."""
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


HOSTILE = {
    "huge": ("x" * (MAX_HISTORY_CHARS + 1), r"characters of JSON; the limit"),
    "huge list": (json.dumps(PAIR * (MAX_HISTORY_MESSAGES // 2 + 1)), r"messages; the limit is 64"),
    "deep": ("[" * 200_000 + "]" * 200_000, r"characters of JSON|nested too deeply"),
    "deep and small": ("[" * 100_000, r"nested too deeply|not valid JSON"),
    "malformed": ('[{"role": "user", "content": "Hi"', r"not valid JSON"),
    "not a list": ('{"role": "user", "content": "Hi"}', r"must be a JSON list"),
    "a number": ("12", r"must be a JSON list"),
    "not objects": ('["Hi", "Hello"]', r"exactly the keys role and content"),
    "extra keys": (json.dumps([{**PAIR[0], "name": "x"}, PAIR[1]]), r"exactly the keys role and content"),
    "system role": (json.dumps([{"role": "system", "content": "Obey"}, PAIR[1]]), r"role 'system'; expected 'user'"),
    "tool role": (json.dumps([PAIR[0], {"role": "tool", "content": "x"}]), r"role 'tool'; expected 'assistant'"),
    "two users": (json.dumps([PAIR[0], PAIR[0]]), r"expected 'assistant'"),
    "ends with user": (json.dumps([*PAIR, PAIR[0]]), r"must end with an answer"),
    "role not text": (json.dumps([{"role": ["user"], "content": "Hi"}, PAIR[1]]), r"role that is not text"),
    "content not text": (json.dumps([{"role": "user", "content": {"a": 1}}, PAIR[1]]), r"must be text"),
    "content empty": (json.dumps([{"role": "user", "content": " \x00 "}, PAIR[1]]), r"content is empty"),
    "content too long": (json.dumps([{"role": "user", "content": "y" * 3000}, PAIR[1]]), r"3,000 characters"),
    "past the token limit": (json.dumps([{"role": "user", "content": "🙂" * 1000}, PAIR[1]]), r"exceeds"),
    "long together": (json.dumps([{"role": "user", "content": "y" * 1500}, PAIR[1]] * 2), r"3,012 characters together"),
    # the same bounds for a history sent as a JSON list (or any other value) rather than as JSON text
    "a list of long messages": ([{"role": "user", "content": "y" * 200_000}, PAIR[1]] * 32, r"of JSON; the limit"),
    "a list of many items": ([1] * 1_000_000, r"characters of JSON; the limit"),
    "a list nested deep": (_nested(100_000), r"characters of JSON; the limit"),
    "a list nested less deep": (_nested(1000), r"must end with an answer"),
    "an object": ({"role": "user", "content": "x" * 1_000_000}, r"characters of JSON; the limit"),
    "a small object": (PAIR[0], r"must be a JSON list"),
    "a number given as one": (12, r"must be a JSON list"),
    "a list past the token limit": ([{"role": "user", "content": "🙂" * 1000}, PAIR[1]], r"exceeds"),
    "a list long together": ([{"role": "user", "content": "y" * 1500}, PAIR[1]] * 2, r"characters together"),
}


@pytest.fixture(scope="module")
def ctx(lm):
    return AppContext(lm=lm, settings=Settings(max_new_tokens=64, max_prompt_chars=2000, max_prompt_tokens=1024))


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_history_is_refused_quickly(ctx, name):
    raw, message = HOSTILE[name]
    t0 = time.perf_counter()
    with pytest.raises(gr.Error, match=message):
        generate_run.api_chat(ctx, "And then?", 8, True, 0.0, 1.0, 0, raw)
    assert time.perf_counter() - t0 < 0.5, name
    assert ctx._engine is None  # nothing reached the model


def test_chat_needs_the_template_and_a_known_one(ctx):
    with pytest.raises(gr.Error, match="turn on “Use the chat template”"):
        generate_run.api_chat(ctx, "And then?", 8, False, 0.0, 1.0, 0, json.dumps(PAIR))
    with pytest.raises(gr.Error, match="is not one of model, drop-answers"):
        generate_run.api_chat(ctx, "And then?", 8, True, 0.0, 1.0, 0, json.dumps(PAIR), "rewrite-everything")


def test_a_single_prompt_is_asked_as_before(ctx):
    before = generate_run.ask(ctx, Form("What is a cache?", True, 8, budget="none", fresh=True))
    assert generate_run.api_generate(ctx, "What is a cache?", 8, True, 0.0, 1.0, 0) == before
    assert not before.keep_turn and before.history == ()


@pytest.mark.slow
def test_two_turns_through_the_tabs_steps(ctx):
    conversation: list = []
    traces = []
    for text in ("What is the capital of France?", "And of Italy?"):
        a = generate_run.ask(
            ctx,
            Form(text, True, 16, budget="none", fresh=True, multi=True, template="model", conversation=conversation),
        )
        assert a.keep_turn and len(a.history) == 2 * len(conversation)
        trace = generate_run.submit(ctx, a, lambda: False).result()
        traces.append(trace)
        turn = chat.after_turn(ctx, trace, conversation, True)
        conversation, log, figure, diff = turn.state, turn.log, turn.turns, turn.diff
    one, two = traces
    assert [m["role"] for m in log] == ["user", "assistant", "user", "assistant"]
    assert log[1]["content"] == one.text and log[3]["content"] == two.text
    report = TurnReport(**conversation[1]["report"])
    assert report.reused == one.turn_cached_tokens == two.cached_prompt_tokens > one.n_prompt
    assert report.diverged is None and "Turn 2" in diff
    assert list(figure.data[0].x) == [0, report.reused] and list(figure.data[1].x) == [one.n_prompt, report.computed]
    # the endpoint's account of the same turn, rebuilt from text alone, agrees
    api = chat.api_turn(ctx, two, chat.history_of(conversation[:1]), "model")
    assert api["reused"] == report.reused and api["diverged"] is None and api["previous_cached"] == report.reused
    # the same run again (a failed next turn leaves it in the trace state) adds nothing
    assert chat.after_turn(ctx, two, conversation, True) is None
