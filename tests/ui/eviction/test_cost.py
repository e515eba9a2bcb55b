"""The Eviction tab's cost estimate counts KVzip's repeat of the context (its second pass over the prompt)."""

from __future__ import annotations

import pytest

from kvviz.eviction import reconstruction
from kvviz.limits import job_cost, model_seconds
from kvviz.settings import Settings
from kvviz.ui.eviction import tab
from kvviz.ui.eviction.request import api_evict, request_size
from kvviz.ui.serving.context import AppContext
from kvviz.ui.serving.job import Job

CONTEXT = " ".join(f"Room {i} holds the {i}th box of the archive." for i in range(12))
QUESTION = "Question: Which room holds the 5th box?"


@pytest.fixture(scope="module")
def ctx(lm):
    return AppContext(lm=lm, settings=Settings(max_new_tokens=64))


def checked(ctx, policy: str):
    args = (CONTEXT, QUESTION, True, policy, "ratio", None, 0.5, 4, {}, tab.COMPRESS_QUESTION)
    return tab.check_request(ctx, *args)


def cost(ctx, req):
    s = request_size(req)
    info = ctx.info
    return job_cost(
        s.prompt_tokens, s.new_tokens, info.layers, info.kv_bytes_per_token, s.runs, s.window, s.repeat_passes
    )


def test_kvzips_estimate_exceeds_snapkvs_by_the_repeat_pass_it_runs(ctx, lm, monkeypatch):
    kvzip, snapkv = checked(ctx, "kvzip"), checked(ctx, "snapkv")
    assert kvzip.ids == snapkv.ids
    fed = []  # what the repeat pass really feeds: (keys already cached, tokens fed), per forward
    real = reconstruction.forward

    def counting(lm_, ids, start, cache, recorder, *args, **kwargs):
        fed.append((cache.get_seq_length(), len(ids)))
        return real(lm_, ids, start, cache, recorder, *args, **kwargs)

    monkeypatch.setattr(reconstruction, "forward", counting)
    kvzip.run(lm, record_history=False)
    layers, n = ctx.info.layers, len(kvzip.ids)
    assert [c for c, _ in fed] == [n]  # one pass over the prefilled prompt (a short prompt is one chunk)
    measured_reads = layers * sum(q * c + q * (q + 1) // 2 for c, q in fed)  # the i-th fed token reads c + i keys
    a, b = cost(ctx, kvzip), cost(ctx, snapkv)
    assert a.key_reads - b.key_reads == measured_reads
    assert a.token_passes - b.token_passes == layers * sum(q for _, q in fed)
    prefill = layers * n * (n + 1) // 2
    assert 2 <= measured_reads / prefill <= 3.5  # KVzip's 2–3× the prefill's attention
    rate = ctx.settings.key_reads_per_s
    assert model_seconds(a, rate) - model_seconds(b, rate) == pytest.approx(measured_reads / rate)
    assert "repeat-pass tokens" in a.describe() and "repeat" not in b.describe()


def test_the_gate_is_told_kvzips_expected_time(ctx):
    """The estimate a job is admitted with (the busy message's "this one about N s more") includes the pass."""
    seconds = []
    for policy in ("kvzip", "snapkv"):
        ticket = Job(ctx, api_evict, checked(ctx, policy), None, None).admit()
        seconds.append(ticket.cost_s)
        ticket.release()
    assert seconds[0] > seconds[1] > 0
