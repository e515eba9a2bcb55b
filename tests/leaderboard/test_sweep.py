"""The sweep: one prefill per sample, every cell decoded in one batch — and each cell equals its own evicted run."""

from __future__ import annotations

import numpy as np
import pytest

from kvviz.eviction.policies import make_policy
from kvviz.eviction.run import run_policy
from kvviz.leaderboard.sweep import METRICS, run_sweep, sweep_policies
from kvviz.leaderboard.tasks import make_sample


@pytest.fixture(scope="module")
def swept(lm):
    sample = make_sample(lm, "passkey", 200, 0.5, 0)
    return sample, run_sweep(lm, [sample], ["streaming_llm", "adakv", "knorm"], [0.0, 0.5], max_new_tokens=6)


def test_every_cell_is_recorded_and_the_full_cache_starts_every_curve(swept):
    sample, result = swept
    df = result.frame()
    assert len(df) == 3 * 2 * 2 and set(df["mode"]) == {"query_aware", "query_agnostic"}
    full = df[df["ratio"] == 0.0]
    assert full["answer"].nunique() == 1 and (full["top1_agreement"] == 1).all() and (full["mean_kl"] == 0).all()
    table = result.table()
    assert set(METRICS) <= set(table.columns) and (table["samples"] == 1).all()
    assert result.timings["samples"] == 1 and result.timings["prefill_s"] > 0
    assert result.to_json()["samples"][0]["key"] == sample.key


def test_achieved_compression_is_measured_from_the_cache(swept):
    sample, result = swept
    df = result.frame().set_index(["policy", "mode", "ratio"])
    for mode, n in (("query_aware", len(sample.ids)), ("query_agnostic", sample.n_context)):
        kept = int(n * 0.5)
        row = df.loc[("knorm", mode, 0.5)]
        assert row["achieved_ratio"] == pytest.approx(1 - kept / n) == row["achieved_ratio_held"]
        ada = df.loc[("adakv", mode, 0.5)]
        assert ada["achieved_ratio_held"] == pytest.approx(1 - kept / n)  # AdaKV keeps Hkv × n_kept per layer
        assert ada["achieved_ratio"] < ada["achieved_ratio_held"]  # padded per layer to its fullest head
    streaming = df.loc[("streaming_llm", "query_aware", 0.5)]
    n, (a, b) = len(sample.ids), sample.needle_span
    recent = int(n * 0.5) - 4  # 4 sinks, the rest the newest entries
    assert streaming["needle_retention"] == pytest.approx(np.mean([p < 4 or p >= n - recent for p in range(a, b)]))


@pytest.mark.parametrize("name", ["adakv", "knorm"])
@pytest.mark.parametrize("mode", ["query_aware", "query_agnostic"])
def test_a_batch_row_answers_as_its_own_evicted_cache(lm, swept, name, mode):
    sample, result = swept
    run = run_policy(
        lm,
        sample.ids,
        make_policy(name),
        ratio=0.5,
        max_new_tokens=6,
        record_history=False,
        n_compress=None if mode == "query_aware" else sample.n_context,
    )
    row = result.frame().set_index(["policy", "mode", "ratio"]).loc[(name, mode, 0.5)]
    assert row["answer"] == run.text


def test_policies_that_decide_while_decoding_are_refused():
    with pytest.raises(ValueError, match="compresses once"):
        sweep_policies(["h2o"])
    assert [p.name for p in sweep_policies(["window", "tova"])] == ["window", "tova"]
