"""``/metrics``'s text: Prometheus' own parser reads it under vLLM's names, and the counters move as a room runs."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvviz.admission import Gate, Refusals
from kvviz.engine.engine import Engine
from kvviz.engine.handle import wait_all
from kvviz.engine.metrics import ServingNumbers, exposition, read_numbers

VLLM = {
    "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
}


def samples(numbers: ServingNumbers) -> dict[tuple[str, tuple], float]:
    """Every sample of the exposition as Prometheus reads it: (name, sorted labels) → value."""
    text = exposition(numbers).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_prometheus_reads_every_metric_under_vllms_names():
    numbers = ServingNumbers(
        "SmolLM2", 0.25, {"computed": 30, "memory": 16, "disk": 8}, 2, 5, 4096, {"queue_full": 3, "memory": 1}
    )
    got = samples(numbers)
    model = (("model_name", "SmolLM2"),)
    assert got[("vllm:kv_cache_usage_perc", model)] == 0.25
    assert got[("vllm:prefix_cache_queries_total", model)] == 54  # tokens looked up
    assert got[("vllm:prefix_cache_hits_total", model)] == 24  # found in memory or on disk
    assert got[("vllm:num_requests_running", model)] == 2 and got[("vllm:num_requests_waiting", model)] == 5
    assert got[("kvviz:prompt_tokens_total", (("source", "disk"),))] == 8
    assert got[("kvviz:disk_tier_bytes", ())] == 4096
    assert got[("kvviz:refusals_total", (("reason", "queue_full"),))] == 3
    families = {f.name for f in text_string_to_metric_families(exposition(numbers).decode())}
    assert families >= VLLM


@pytest.mark.slow
def test_the_counters_move_as_a_room_runs(lm):
    engine = Engine(lm, gather_s=0.5, gather_max_s=5.0)
    gate, refusals = Gate(slots=1), Refusals()
    before = samples(read_numbers(lm.name, engine.prefix, [gate], refusals.snapshot()))
    model = (("model_name", lm.name),)
    assert before[("vllm:prefix_cache_queries_total", model)] == 0
    held = gate.admit("a", "generation")
    waiting = gate.admit("b", "generation")
    handles = [engine.submit("Alpha " * 20, chat=False, max_new_tokens=2, owner=o) for o in ("a", "b", "c")]
    assert wait_all(handles, 600)
    handles = [engine.submit("Alpha " * 20 + "Beta", chat=False, max_new_tokens=2, owner="d")]
    assert wait_all(handles, 600)
    refusals.count("queue_full")
    after = samples(read_numbers(lm.name, engine.prefix, [gate], refusals.snapshot()))
    assert after[("vllm:prefix_cache_queries_total", model)] > 0
    assert after[("vllm:prefix_cache_hits_total", model)] >= 16  # the fourth request found Alpha's blocks
    assert 0 < after[("vllm:kv_cache_usage_perc", model)] <= 1
    assert after[("vllm:num_requests_running", model)] == 1 and after[("vllm:num_requests_waiting", model)] == 1
    assert after[("kvviz:refusals_total", (("reason", "queue_full"),))] == 1
    computed = after[("kvviz:prompt_tokens_total", (("source", "computed"),))]
    memory = after[("kvviz:prompt_tokens_total", (("source", "memory"),))]
    assert computed + memory == after[("vllm:prefix_cache_queries_total", model)]
    held.release()
    waiting.release()
    engine.close()
