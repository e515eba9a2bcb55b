"""The Eviction status for a policy whose budgets differ by head (KVzip): it gives the spread the budget map draws,
names the moment of each byte count, and does not offer the question a vote the policy never reads."""

from __future__ import annotations

import re

import gradio as gr
import pytest

from kvviz.settings import Settings
from kvviz.ui.eviction import tab
from kvviz.ui.serving.context import AppContext
from kvviz.units import format_bytes

CONTEXT = "The KV cache stores the keys and values of every token so that decoding does not recompute them. " * 6


@pytest.fixture(scope="module")
def ctx(lm):
    return AppContext(lm=lm, settings=Settings(max_new_tokens=64))


@pytest.fixture(scope="module")
def kvzip(ctx):
    req = tab.check_request(ctx, CONTEXT, "", True, "kvzip", "ratio", None, 0.5, 4, None, tab.COMPRESS_QUESTION)
    run = req.run(ctx.lm)
    return run, tab.status_text(run, req.policy)


def test_a_ragged_budget_is_said_as_its_mean_fewest_and_most(kvzip):
    run, text = kvzip
    counts = run.kept_counts()
    assert counts.min() < counts.max()  # KVzip's heads keep different counts here
    assert f"from **{counts.min()}** to **{counts.max()}**" in text and f"mean {counts.mean():.1f}" in text
    assert "on average" in text


def test_the_status_names_after_the_answer_and_after_the_prefill_and_matches_the_table(kvzip):
    run, text = kvzip
    table = tab.fig.budget_bytes(run)
    after_prefill = table["bytes right after the prefill"].tolist()  # kvpress (full), kvviz's padded cache, ragged
    assert f"**after the answer** ({len(run.step_bytes) - 1} tokens fed after the compression)" in text
    assert f"**{format_bytes(run.cache_bytes)}**" in text and f"**{format_bytes(run.full_cache_bytes)}**" in text
    assert f"**right after the prefill** (the table of stores): {after_prefill[1]} vs {after_prefill[0]}." in text


def test_a_policy_that_never_reads_the_question_is_not_offered_its_vote(ctx):
    for name in ("kvzip", "knorm", "streaming_llm"):
        label = dict((v, k) for k, v in tab.compress_choices(name))[tab.COMPRESS_QUESTION]
        assert "it votes" not in label and "does not vote" in label
    assert "it votes" in dict((v, k) for k, v in tab.compress_choices("snapkv"))[tab.COMPRESS_QUESTION]
    with gr.Blocks() as demo:
        tab.build(ctx)
    policy, compress = ctx.components["eviction.policy"], ctx.components["eviction.compress"]
    (change,) = [f for f in demo.fns.values() if (policy._id, "change") in f.targets]
    assert compress in change.outputs
    radio = change.fn("kvzip")[compress]
    assert re.search("KVzip never reads its queries", str(radio.choices))
