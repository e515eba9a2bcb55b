"""``GET /metrics`` and ``GET /kv-events`` on the running app: Prometheus' parser reads the first, the counters move
when a room's request runs, and the second replays into the engine's cached blocks as ``/engine`` counts them."""

from __future__ import annotations

import json
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from kvviz.engine.kv_events import replay


def _get(url: str) -> tuple[str, str]:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return resp.headers.get("Content-Type", ""), resp.read().decode()


def _values(base: str) -> dict[str, float]:
    kind, text = _get(base + "metrics")
    assert kind.startswith("text/plain")
    return {
        s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if "source" not in s.labels
    }


def test_metrics_and_kv_events_follow_the_room(app_server, client):
    before = _values(app_server)
    for name in ("vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting"):
        assert name in before
    prompt = "Tell me one fact about the metrics endpoint of this app."
    client.predict(prompt, 4, True, 0.0, 1.0, 0, api_name="/generate")
    client.predict(prompt + " Again.", 4, True, 0.0, 1.0, 0, api_name="/generate")
    after = _values(app_server)
    assert after["vllm:prefix_cache_queries_total"] > before.get("vllm:prefix_cache_queries_total", 0)
    assert after["vllm:prefix_cache_hits_total"] > before.get("vllm:prefix_cache_hits_total", 0)
    assert after["vllm:kv_cache_usage_perc"] > 0
    _, text = _get(app_server + "kv-events")
    kinds = {e["type"] for line in text.splitlines() for e in json.loads(line)["events"]}
    assert "BlockStored" in kinds
    engine = client.predict(api_name="/engine")
    assert len(replay(text)) == engine["prefix_cache"]["blocks"]
