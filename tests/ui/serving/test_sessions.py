"""How the tabs turn library errors into messages (``kvviz.ui.serving.sessions.user_errors``)."""

from __future__ import annotations

import gradio as gr
import pytest

from kvviz.ui import attention as tab_attention
from kvviz.ui import nocache as tab_nocache
from kvviz.ui.serving.sessions import user_errors


def test_a_library_value_error_becomes_its_message():
    with pytest.raises(gr.Error, match="budget must be positive"), user_errors():
        raise ValueError("budget must be positive")


def test_a_gr_error_passes_through_unchanged():
    original = gr.Error("already readable")
    with pytest.raises(gr.Error) as caught, user_errors("Eviction run"):
        raise original
    assert caught.value is original


def test_other_failures_end_the_job_only_when_named():
    with (
        pytest.raises(gr.Error, match=r"Eviction run failed: RuntimeError: out of memory"),
        user_errors("Eviction run"),
    ):
        raise RuntimeError("out of memory")
    with pytest.raises(RuntimeError), user_errors():
        raise RuntimeError("a bug, not the user's input")


@pytest.mark.parametrize("whole", [tab_attention._whole, tab_nocache._whole])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 2.5, "ten", None, 99])
def test_tab_number_checks_refuse_bad_values_with_a_message(whole, bad):
    with pytest.raises(gr.Error, match="Layer must be"):
        whole(bad, "Layer", 0, 29)
    assert whole(3.0, "Layer", 0, 29) == 3
