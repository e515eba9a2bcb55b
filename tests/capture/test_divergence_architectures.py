"""The finder on the architecture matrix: with no fault, no architecture diverges from its recomputation
(tiny random models of every family kvviz captures); a sliding-window fault is found on a sliding model."""

from __future__ import annotations

import pytest

from kvviz.capture.divergence import debug
from kvviz.capture.faults import make_fault
from tests.tiny_models import CONFIG_NAMES, tiny_model

pytestmark = pytest.mark.slow  # a tiny model per architecture

PROMPT = list(range(100, 120))  # 20 tokens, longer than the sliding windows (8)
NEW = 6


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_no_fault_no_divergence(name):
    report = debug(tiny_model(name), "", None, chat=False, prompt_ids=PROMPT, max_new_tokens=NEW)
    assert report.first is None, (name, report.first)
    assert report.tokens_changed_from is None, name
    assert report.ratio.shape[0] == NEW


@pytest.mark.parametrize(("step", "layer"), [(1, 0), (3, 0)])
def test_a_sliding_window_off_by_one_is_found_where_it_strikes(step, layer):
    report = debug(
        tiny_model("mistral"),
        "",
        make_fault("sliding_window_off_by_one", step=step, layer=layer),
        chat=False,
        prompt_ids=PROMPT,
        max_new_tokens=NEW,
    )
    f = report.first
    assert f is not None and (f.step, f.layer, f.position) == (step, layer, len(PROMPT) + step - 1)
    assert f.quantity == "attention output"
