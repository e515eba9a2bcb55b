"""Canaries: the Gradio internals behind :mod:`kvviz.ui.serving.gradio_adapter` still mean what kvviz assumes."""

from __future__ import annotations

import inspect

import gradio as gr
from gradio.state_holder import SessionState, StateHolder

from kvviz.ui.serving import gradio_adapter as adapter


def served_blocks() -> gr.Blocks:
    """A Blocks with the state holder Gradio attaches when it serves the app."""
    with gr.Blocks() as demo:
        gr.State(None)
    StateHolder().set_blocks(demo)
    return demo


def test_session_states_are_found_on_the_app():
    demo = served_blocks()
    assert adapter.session_states(demo) is demo.state_holder.session_data == {}
    demo.state_holder["abc"]  # Gradio makes a session's state on first use
    assert list(adapter.state_values(demo)) == ["abc"]


def test_a_closed_sessions_lifetime_is_the_attribute_gradio_expires_it_by():
    demo = served_blocks()
    state = demo.state_holder["abc"]
    assert isinstance(state, SessionState) and state.STATE_TTL_WHEN_CLOSED >= 1
    assert "self.STATE_TTL_WHEN_CLOSED" in inspect.getsource(SessionState), (
        "Gradio no longer expires closed state by it"
    )
    assert adapter.keep_closed_state_for(demo, "abc", 7) and state.STATE_TTL_WHEN_CLOSED == 7
    assert not adapter.keep_closed_state_for(demo, "unknown", 7)


def test_expired_closed_sessions_are_dropped_and_open_ones_kept():
    demo = served_blocks()
    closed, open_ = demo.state_holder["closed"], demo.state_holder["open"]
    assert closed.state_data == {} and closed.is_closed is False
    closed.is_closed = True
    assert adapter.drop_expired_sessions(demo) == 1
    assert list(adapter.session_states(demo)) == ["open"] and open_ is demo.state_holder["open"]


def page_blocks() -> gr.Blocks:
    with gr.Blocks() as demo:
        gr.State(None)
        box = gr.Textbox("hello", label="Prompt")
        gr.Slider(1, 10, value=3, label="Tokens")
        gr.Button("Go").click(lambda x: x, box, box)
    StateHolder().set_blocks(demo)
    return demo


def test_a_new_session_builds_no_component_config_until_one_is_read(monkeypatch):
    assert "config_values" in inspect.getsource(adapter._EAGER_INIT), "Gradio no longer builds them at init"
    demo = page_blocks()
    eager = demo.state_holder["eager"]
    built = []
    monkeypatch.setattr(
        type(eager.blocks_config),
        "config_for_block",
        staticmethod(lambda *a, _f=type(eager.blocks_config).config_for_block: built.append(a[0]) or _f(*a)),
    )
    try:
        adapter.build_session_configs_lazily()
        lazy = demo.state_holder["lazy"]
        assert built == []
        assert list(lazy.components) == list(eager.components) and len(built) == len(demo.blocks)
    finally:
        adapter.build_session_configs_lazily(False)
    assert SessionState.__init__ is adapter._EAGER_INIT


def test_a_lazy_session_takes_value_updates_like_an_eager_one():
    demo = page_blocks()
    box = next(b for b in demo.blocks.values() if isinstance(b, gr.Textbox))
    eager = demo.state_holder["eager"]
    adapter.build_session_configs_lazily()
    try:
        lazy = demo.state_holder["lazy"]
    finally:
        adapter.build_session_configs_lazily(False)
    for state in (eager, lazy):
        state._update_value_in_config(box._id, "changed")
    assert list(lazy.components) == list(eager.components)
    assert any(c.get("props", {}).get("value") == "changed" for c in lazy.components)


def test_a_registered_slider_passes_a_typed_number_even_in_a_sessions_rebuilt_copy():
    plain = gr.Slider(0, 29, step=1, elem_id="canary-plain")
    typed = adapter.pass_typed_values(gr.Slider(0, 29, step=1, elem_id="canary-typed"))
    try:
        plain.preprocess(99)
        raise AssertionError("Gradio no longer checks a slider's range in preprocess")
    except gr.Error as exc:
        assert "greater than maximum" in str(exc)
    assert typed.preprocess(99) == 99
    kwargs = {**typed.constructor_args, "render": False}  # how Gradio rebuilds a session's copy on an update
    kwargs.pop("value", None)
    assert type(typed)(**kwargs).preprocess(99) == 99
