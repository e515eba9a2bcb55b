"""The server's numbers in Prometheus' text format, under vLLM's metric names where they mean the same thing.

Engineers watch a serving engine's cache through vLLM's ``/metrics``; kvviz serves the same names for its own
engine, so the same dashboards and alerts read it:

- ``vllm:kv_cache_usage_perc`` (gauge, 0–1): the share of the engine's prefix-cache byte budget in use
  (vLLM: the share of KV blocks in use; kvviz's running requests keep their own caches beside it);
- ``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits`` (counters, in tokens, as vLLM counts them): prompt
  tokens the engine looked up in its prefix cache, and those it found there (memory or disk tier);
- ``vllm:num_requests_running`` / ``vllm:num_requests_waiting`` (gauges): model jobs running and waiting at the
  app's gates (Generate runs and every other model job);

and kvviz's own: ``kvviz:prompt_tokens`` by ``source`` (computed, memory, disk), ``kvviz:disk_tier_bytes``, and
``kvviz:refusals`` by ``reason`` (the gates' and ZeroGPU's). Every vLLM metric carries ``model_name``.
:func:`exposition` is pure: it turns a :class:`ServingNumbers` into the text ``prometheus_client`` writes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from kvviz.admission import Gate
from kvviz.engine.prefix import COMPUTED, DISK, MEMORY, PrefixStore

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # Prometheus' text format


@dataclass(frozen=True)
class ServingNumbers:
    """What ``/metrics`` reports, read at one moment (plain values)."""

    model_name: str
    kv_usage: float = 0.0
    tokens_by_source: Mapping[str, int] = field(default_factory=dict)
    running: int = 0
    waiting: int = 0
    disk_bytes: int = 0
    refusals: Mapping[str, int] = field(default_factory=dict)


def read_numbers(model_name: str, store: PrefixStore | None, gates: Iterable[Gate], refusals: Mapping[str, int]):
    """The numbers now: the prefix store's statistics and token counts, the gates' lines, the refusals so far."""
    stats = {} if store is None else store.stats()
    snaps = [g.snapshot() for g in gates]
    capacity = stats.get("capacity_bytes", 0)
    return ServingNumbers(
        model_name,
        kv_usage=stats.get("bytes_held", 0) / capacity if capacity else 0.0,
        tokens_by_source={} if store is None else dict(store.source_tokens),
        running=sum(s["running"] for s in snaps),
        waiting=sum(s["waiting"] for s in snaps),
        disk_bytes=stats.get("disk_bytes", 0),
        refusals=dict(refusals),
    )


class _Collector:
    def __init__(self, numbers: ServingNumbers):
        self.n = numbers

    def collect(self):
        n, model = self.n, [self.n.model_name]
        tokens = {k: n.tokens_by_source.get(k, 0) for k in (COMPUTED, MEMORY, DISK)}
        usage = GaugeMetricFamily(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage: share of the prefix cache's byte budget held.",
            labels=["model_name"],
        )
        usage.add_metric(model, n.kv_usage)
        queries = CounterMetricFamily(
            "vllm:prefix_cache_queries", "Prefix cache queries, in prompt tokens.", labels=["model_name"]
        )
        queries.add_metric(model, sum(tokens.values()))
        hits = CounterMetricFamily(
            "vllm:prefix_cache_hits", "Prefix cache hits, in prompt tokens.", labels=["model_name"]
        )
        hits.add_metric(model, tokens[MEMORY] + tokens[DISK])
        running = GaugeMetricFamily("vllm:num_requests_running", "Model jobs running.", labels=["model_name"])
        running.add_metric(model, n.running)
        waiting = GaugeMetricFamily("vllm:num_requests_waiting", "Model jobs waiting.", labels=["model_name"])
        waiting.add_metric(model, n.waiting)
        by_source = CounterMetricFamily(
            "kvviz:prompt_tokens", "Prompt tokens by where their keys and values came from.", labels=["source"]
        )
        for source, count in tokens.items():
            by_source.add_metric([source], count)
        disk = GaugeMetricFamily("kvviz:disk_tier_bytes", "Bytes of prefix blocks held on the disk tier.")
        disk.add_metric([], n.disk_bytes)
        refused = CounterMetricFamily("kvviz:refusals", "Requests refused, by reason.", labels=["reason"])
        for reason, count in sorted(n.refusals.items()):
            refused.add_metric([reason], count)
        yield from (usage, queries, hits, running, waiting, by_source, disk, refused)


def exposition(numbers: ServingNumbers) -> bytes:
    """``numbers`` in Prometheus' text format (``prometheus_client.generate_latest``)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(numbers))
    return generate_latest(registry)
