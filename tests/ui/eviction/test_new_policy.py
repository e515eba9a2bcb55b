"""A new policy is one module and one registry line: the tab, the CLI and the API all offer it from its fields."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import gradio as gr
import pytest
import torch

from kvviz.__main__ import main
from kvviz.eviction.policies import POLICIES, WINDOW, PolicyState
from kvviz.eviction.policies.scorer import ScorerPolicy, protect_ends
from kvviz.settings import Settings
from kvviz.ui.eviction import tab
from kvviz.ui.serving.context import AppContext

PROMPT = "Write one sentence about the sea and the ships that sail on it."


@dataclass
class KeepEven(ScorerPolicy):
    """A toy: the newest ``recent`` entries stay; among the others, even positions win."""

    recent: int = field(default=2, metadata={"help": "newest entries always kept", "min": 1, "max": 64})

    name = "keep_even"
    title = "Keep even (toy)"
    summary = "Keeps the newest entries and even positions."

    def protect(self, state: PolicyState) -> torch.Tensor:
        return protect_ends(state.positions.shape[-1], 0, WINDOW, self.recent, WINDOW, state.positions.device)

    def score(self, state: PolicyState) -> torch.Tensor:
        return (state.positions % 2 == 0).float()


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(POLICIES, "keep_even", KeepEven)


def check_kept(out: dict, recent: int) -> None:
    n = out["prompt_tokens"]
    assert out["policy"] == "keep_even" and out["params"] == {"recent": recent} and out["n_kept"] == 8
    for layer in out["kept"]:
        for head in layer:
            assert head[-recent:] == list(range(n - recent, n))
            assert all(p % 2 == 0 for p in head[:-recent])


def test_the_cli_has_a_flag_for_it_and_runs_it(registered, lm, capsys, monkeypatch):
    monkeypatch.setattr("kvviz.models.load_model", lambda *a, **k: lm)  # the session's model, not a second load
    code = main(
        [
            "evict",
            "--prompt",
            PROMPT,
            "--policy",
            "keep_even",
            "--budget",
            "8",
            "--recent",
            "3",
            "--max-new-tokens",
            "2",
            "--json",
        ]
    )
    assert code == 0
    check_kept(json.loads(capsys.readouterr().out), 3)


@pytest.mark.slow
def test_the_api_takes_its_params_and_the_tab_builds_its_widget(registered, lm):
    ctx = AppContext(lm=lm, settings=Settings(max_new_tokens=8))
    check_kept(tab.api_evict(ctx, PROMPT, "keep_even", 8, None, True, 2, {"recent": 4}), 4)
    with pytest.raises(gr.Error, match="recent must be between 1 and 64"):
        tab.api_evict(ctx, PROMPT, "keep_even", 8, None, True, 2, {"recent": 0})
    with gr.Blocks() as demo:
        tab.build(ctx)
    labels = [getattr(block, "label", None) or "" for block in demo.blocks.values()]
    assert any(label.startswith("recent — newest entries always kept") for label in labels)
    dropdown = ctx.components["eviction.policy"]
    assert ("Keep even (toy)", "keep_even") in [tuple(c) for c in dropdown.choices]


NEW = {
    "knorm": {},
    "tova": {},
    "expected_attention": {"n_sink": 2, "use_covariance": False},
    "pyramidkv": {"window_size": 8, "beta": 2},
    "adakv": {"window_size": 8, "alpha_safeguard": 0.5},
}


def test_the_registry_gives_every_policy_a_dropdown_entry_and_cli_flags(lm):
    ctx = AppContext(lm=lm, settings=Settings(max_new_tokens=8))
    with gr.Blocks() as demo:
        tab.build(ctx)
    offered = [tuple(c) for c in ctx.components["eviction.policy"].choices]
    assert all((cls.title, name) in offered for name, cls in POLICIES.items())
    labels = [getattr(block, "label", None) or "" for block in demo.blocks.values()]
    for name in ("beta", "alpha_safeguard", "n_future_positions", "use_vnorm"):
        assert any(label.startswith(name.replace("_", " ") + " — ") for label in labels), name


@pytest.mark.parametrize("name", list(NEW))
def test_each_new_policy_runs_through_the_api(lm, name):
    ctx = AppContext(lm=lm, settings=Settings(max_new_tokens=8))
    out = tab.api_evict(ctx, PROMPT, name, None, 0.5, True, 2, NEW[name])
    n = out["prompt_tokens"]
    counts = [[len(head) for head in layer] for layer in out["kept"]]
    assert out["policy"] == name and out["n_kept"] == n // 2 and out["text"]
    mean = sum(map(sum, counts)) / (30 * 3)
    assert abs(mean - n // 2) <= 1  # ragged budgets keep n_kept per head on average
    assert out["held_bytes_after_prefill"] == sum(map(sum, counts)) * 64 * 2 * 4


def test_a_bool_parameter_can_be_turned_off_from_the_cli(lm, capsys, monkeypatch):
    monkeypatch.setattr("kvviz.models.load_model", lambda *a, **k: lm)
    code = main(
        [
            "evict",
            "--prompt",
            PROMPT,
            "--policy",
            "expected_attention",
            "--ratio",
            "0.5",
            "--no-use-covariance",
            "--n-sink",
            "2",
            "--max-new-tokens",
            "2",
            "--json",
        ]
    )
    assert code == 0
    params = json.loads(capsys.readouterr().out)["params"]
    assert params["use_covariance"] is False and params["n_sink"] == 2 and params["use_vnorm"] is True
