"""The sweep: every policy × compression ratio × mode on every sample, one prefill per sample.

Per sample: one prefill (:func:`kvviz.leaderboard.cells.prefill`), each cell's kept set on it
(:func:`~kvviz.leaderboard.cells.decide`), then every cell decoded together as rows of one batch
over the shared prefill (:class:`~kvviz.leaderboard.batch.SharedPrefixCache`): the full cache's
row gives the reference answer; each cell's row generates greedily (its answer, scored with
kvpress's ``string_match_all``) and, from the step it first disagrees with the full cache, forks a
twin fed the full cache's tokens (teacher forcing), so top-1 agreement and KL(full ‖ cell) are
measured along the full cache's answer at the cost of one extra row only where they differ.
Query-agnostic rows first feed the question, uncompressed, on their compressed context.
Compression happens once, after the prefill (kvpress's protocol), for every policy. Usage::

    from kvviz.leaderboard.sweep import run_sweep
    result = run_sweep(lm, samples, ["snapkv", "knorm"], [0.0, 0.5])
    result.table()
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from kvviz.capture.attention_fn import installed
from kvviz.capture.model_io import cache_kwarg
from kvviz.eviction.policies import POLICIES, Policy, make_policy
from kvviz.leaderboard.batch import SharedPrefixCache
from kvviz.leaderboard.cells import MODES, Decision, Prefill, decide, prefill
from kvviz.leaderboard.tasks import Sample, string_match_all
from kvviz.models import LoadedModel

Progress = Callable[[float, str], None]
RATIOS = (0.0, 0.25, 0.5, 0.75, 0.875)
DEFAULT_POLICIES = ("streaming_llm", "snapkv", "knorm", "tova", "expected_attention", "pyramidkv", "adakv", "kvzip")
METRICS = ("string_match", "needle_retention", "top1_agreement", "mean_kl", "achieved_ratio", "achieved_ratio_held")


def sweep_policies(names: list[str]) -> list[Policy]:
    """Registry policies with their defaults; those that decide while decoding are refused (one decision here)."""
    out = []
    for name in names:
        policy = make_policy(name)
        if policy.needs_colsum:
            raise ValueError(
                f"{name} scores by attention accumulated while decoding; the sweep compresses once "
                "after the prefill (kvpress's protocol). Leave it out."
            )
        out.append(policy)
    return out


@dataclass
class _Row:
    cell: int  # index into the sample's cells, -1 = the full cache
    forced: bool  # fed the full cache's tokens instead of its own


def _kl(p: torch.Tensor, q: torch.Tensor) -> float:
    """KL(p ‖ q) in nats from log-probabilities [V]."""
    return max(float((p.exp() * (p - q)).sum()), 0.0)


def decode_cells(
    lm: LoadedModel,
    pre: Prefill,
    cells: list[tuple[str, Decision]],
    max_new_tokens: int,
) -> tuple[list[int], list[dict]]:
    """The full cache's answer ids and, per cell, its own answer ids and teacher-forced agreement / KL per step.

    The one decoding loop of the sweep, and not a run of the solo driver (:mod:`kvviz.capture.drive`) on
    purpose: every cell of the sample is a row of one batched forward per step over the shared prefill
    (:class:`~kvviz.leaderboard.batch.SharedPrefixCache`), rows leave at their own end and fork a forced
    twin where they leave the full cache's answer — one forward for all cells, where the driver would
    take one per cell and copy the prefill into each (a test checks every row against its solo
    :func:`~kvviz.eviction.run.run_policy`, which the driver runs).
    """
    s = pre.sample
    n, n_c = pre.n_tokens, s.n_context
    dev = lm.device
    aware = [i for i, (mode, _) in enumerate(cells) if mode == "query_aware"]
    agnostic = [i for i, (mode, _) in enumerate(cells) if mode != "query_aware"]
    full_keep = torch.ones(len(pre.keys), pre.kv_heads, n, dtype=torch.bool)
    rows = [_Row(-1, False)] + [_Row(i, False) for i in aware + agnostic]
    cache = SharedPrefixCache(pre.keys, pre.values, torch.stack([full_keep] + [cells[i][1].keep for i in aware]))
    logits = pre.logits[None].expand(1 + len(aware), -1)  # query-aware rows answer from the full prefill first
    question = s.ids[n_c:]
    if agnostic:  # feed the question, uncompressed, on each compressed context
        extra = SharedPrefixCache(pre.keys, pre.values, torch.stack([cells[i][1].keep for i in agnostic]))
        out = lm.model(
            input_ids=torch.tensor([question] * len(agnostic), device=dev),
            position_ids=torch.arange(n_c, n, device=dev).expand(len(agnostic), -1),
            **{cache_kwarg(lm.model): extra},
            use_cache=True,
            logits_to_keep=1,
            **extra.forward_kwargs(),
        )
        cache.pad_front(len(question))
        cache.extend(extra)
        logits = torch.cat([logits, out.logits[:, -1]])
    per_cell: list[dict[str, list]] = [{"agree": [], "kl": [], "ids": []} for _ in cells]
    on_path = {c: r for r, row in enumerate(rows) if (c := row.cell) >= 0}  # cell → row following the full answer
    full: list[int] = []
    full_done = False
    for step in range(max_new_tokens):
        logp = torch.log_softmax(logits.float(), -1)
        last = step == max_new_tokens - 1
        f = None
        if not full_done:
            r0 = next(r for r, row in enumerate(rows) if row.cell < 0)
            f = int(logp[r0].argmax())
            full.append(f)
            for c, r in on_path.items():
                per_cell[c]["agree"].append(int(logp[r].argmax()) == f)
                per_cell[c]["kl"].append(_kl(logp[r0], logp[r]))
            full_done = f in lm.stop_ids or last
        index, nxt, feed, path, twins = [], [], [], {}, []
        for r, row in enumerate(rows):
            tok = f if row.cell < 0 or row.forced else int(logp[r].argmax())
            if row.cell >= 0 and not row.forced:
                per_cell[row.cell]["ids"].append(tok)
            done = full_done if row.cell < 0 or row.forced else (tok in lm.stop_ids or last)
            if not done:
                index.append(r)
                nxt.append(row)
                feed.append(tok)
            if row.cell >= 0 and on_path.get(row.cell) == r and not full_done:
                if tok == f:
                    path[row.cell] = len(index) - 1
                else:  # the row leaves the full answer here: a twin carries on along it
                    twins.append((r, row.cell))
        for r, c in twins:
            index.append(r)
            nxt.append(_Row(c, True))
            feed.append(f)
            path[c] = len(index) - 1
        if not index:
            break
        rows, on_path = nxt, path
        cache.rows(index)
        out = lm.model(
            input_ids=torch.tensor(feed, device=dev)[:, None],
            position_ids=torch.full((len(feed), 1), n + step, device=dev),
            **{cache_kwarg(lm.model): cache},
            use_cache=True,
            **cache.forward_kwargs(),
        )
        logits = out.logits[:, -1]
    return full, per_cell


@dataclass
class SweepResult:
    """Per (sample, policy, ratio, mode) records, the samples, and how long it took."""

    records: list[dict]
    samples: list[Sample]
    config: dict
    timings: dict = field(default_factory=dict)
    stopped: bool = False
    skipped: list[dict] = field(default_factory=list)  # cells a policy refused (the reason says why)

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.records)

    def table(self) -> pd.DataFrame:
        """Mean of every metric per policy, mode and requested ratio (the leaderboard's points)."""
        df = self.frame()
        if df.empty:
            return df
        cols = list(METRICS) + [c for c in ("prefill_s", "extra_prefill_s") if c in df]
        return (
            df.groupby(["policy", "mode", "ratio"], as_index=False)[cols]
            .mean()
            .assign(samples=df.groupby(["policy", "mode", "ratio"]).size().values)
        )

    def to_json(self) -> dict:
        samples = [
            {
                "key": s.key,
                "task": s.task,
                "length": s.length,
                "depth": s.depth,
                "seed": s.seed,
                "n_tokens": len(s.ids),
                "n_context": s.n_context,
                "needle_span": list(s.needle_span),
                "value_span": list(s.value_span),
                "answers": s.answers,
                "context": s.context,
                "question": s.question,
            }
            for s in self.samples
        ]
        return {
            "config": self.config,
            "timings": self.timings,
            "stopped": self.stopped,
            "skipped": self.skipped,
            "samples": samples,
            "records": self.records,
            "table": self.table().to_dict(orient="records"),
        }


def run_sweep(
    lm: LoadedModel,
    samples: list[Sample],
    policies: list[str],
    ratios: list[float],
    modes: tuple[str, ...] = MODES,
    max_new_tokens: int = 10,
    progress: Progress | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> SweepResult:
    """Every policy × ratio × mode on every sample; stops cleanly between samples when ``should_stop()``."""
    unknown = [p for p in policies if p not in POLICIES] + [m for m in modes if m not in MODES]
    if unknown:
        raise ValueError(f"Unknown policy or mode {unknown[0]!r}.")
    bad = [r for r in ratios if not 0.0 <= r < 1.0]
    if bad:
        raise ValueError(f"Compression ratios must be in [0, 1), got {bad[0]}.")
    pols = sweep_policies(policies)
    report = progress or (lambda f, d: None)
    config = {
        "policies": list(policies),
        "ratios": list(ratios),
        "modes": list(modes),
        "max_new_tokens": max_new_tokens,
        "model": lm.name,
        "dtype": str(lm.dtype).removeprefix("torch."),
        "device": str(lm.device),
        "threads": torch.get_num_threads(),
    }
    out = SweepResult([], [], config)
    t0 = time.perf_counter()
    prefill_s = decide_s = decode_s = 0.0
    with torch.inference_mode(), installed(lm.model):
        for i, sample in enumerate(samples):
            if should_stop is not None and should_stop():
                out.stopped = True
                break
            report(i / len(samples), f"sample {i + 1}/{len(samples)}: {sample.key}")
            t = time.perf_counter()
            pre = prefill(lm, sample, pols)
            sample_prefill_s = time.perf_counter() - t
            prefill_s += sample_prefill_s
            t = time.perf_counter()
            keys: list[tuple[Policy, float, str]] = []
            cells: list[tuple[str, Decision]] = []
            memo: dict = {}
            for p, r, m in ((p, r, m) for p in pols for r in ratios if r > 0 for m in modes):
                try:
                    cells.append((m, decide(lm, pre, m, p, r, memo)))
                    keys.append((p, r, m))
                except ValueError as exc:  # e.g. a budget below SnapKV's window: kvpress keeps an arbitrary part
                    out.skipped.append(
                        {"sample": sample.key, "policy": p.name, "ratio": r, "mode": m, "reason": str(exc)}
                    )
            decide_s += time.perf_counter() - t
            t = time.perf_counter()
            full, per_cell = decode_cells(lm, pre, cells, max_new_tokens)
            decode_s += time.perf_counter() - t
            rows = _records(lm, pre, keys, cells, full, per_cell, pols, ratios, modes)
            for row in rows:  # what the shared prefill cost; a policy's own pass over it comes on top
                row["prefill_s"] = sample_prefill_s
            out.records += rows
            out.samples.append(sample)
    out.timings = {
        "total_s": time.perf_counter() - t0,
        "prefill_s": prefill_s,
        "decide_s": decide_s,
        "decode_s": decode_s,
        "samples": len(out.samples),
    }
    report(1.0, "done")
    return out


def merged(parts: list[SweepResult], order: list[str]) -> SweepResult:
    """One result from sweeps run over disjoint shares of the samples (e.g. in processes of their own):
    records, samples and skipped cells in ``order`` (sample keys), phase seconds summed over the parts.

    Each sample's cells depend on that sample only, so a sweep split this way records exactly what one
    sweep over all samples would (the bench checks it cell by cell).
    """
    if not parts:
        raise ValueError("Nothing to merge.")
    rank = {key: i for i, key in enumerate(order)}
    samples = sorted((s for p in parts for s in p.samples), key=lambda s: rank[s.key])
    records = sorted((r for p in parts for r in p.records), key=lambda r: rank[r["sample"]])  # stable: cell order kept
    timings = {k: sum(p.timings.get(k, 0) for p in parts) for k in ("prefill_s", "decide_s", "decode_s", "samples")}
    timings["total_s"] = max(p.timings.get("total_s", 0.0) for p in parts)
    return SweepResult(
        records,
        samples,
        {**parts[0].config, "processes": len(parts)},
        timings,
        stopped=any(p.stopped for p in parts),
        skipped=sorted((x for p in parts for x in p.skipped), key=lambda x: rank[x["sample"]]),
    )


def _records(
    lm: LoadedModel, pre: Prefill, keys, cells, full: list[int], per_cell: list[dict], pols, ratios, modes
) -> list[dict]:
    s = pre.sample
    full_text = lm.tokenizer.decode(full, skip_special_tokens=True)
    base = {"sample": s.key, "task": s.task, "length": s.length, "depth": s.depth}
    rows = []
    if 0.0 in ratios:  # the full cache: every policy's curve starts at the same point
        for p in pols:
            for m in modes:
                rows.append(
                    {
                        **base,
                        "policy": p.name,
                        "mode": m,
                        "ratio": 0.0,
                        "answer": full_text,
                        "string_match": string_match_all(full_text, s.answers),
                        "needle_retention": 1.0,
                        "top1_agreement": 1.0,
                        "mean_kl": 0.0,
                        "achieved_ratio": 0.0,
                        "achieved_ratio_held": 0.0,
                        "n_kept": pre.compressed(m),
                        "stored_bytes": None,
                        "held_bytes": None,
                        "extra_prefill_s": 0.0,
                    }
                )
    for (p, r, m), (_, d), got in zip(keys, cells, per_cell):
        text = lm.tokenizer.decode(got["ids"], skip_special_tokens=True)
        rows.append(
            {
                **base,
                "policy": p.name,
                "mode": m,
                "ratio": r,
                "answer": text,
                "string_match": string_match_all(text, s.answers),
                "needle_retention": d.needle_retention,
                "top1_agreement": float(np.mean(got["agree"])) if got["agree"] else 1.0,
                "mean_kl": float(np.mean(got["kl"])) if got["kl"] else 0.0,
                "achieved_ratio": 1 - d.stored_bytes / d.full_bytes,
                "achieved_ratio_held": 1 - d.held_bytes / d.full_bytes,
                "n_kept": d.n_kept,
                "stored_bytes": d.stored_bytes,
                "held_bytes": d.held_bytes,
                "extra_prefill_s": d.extra_prefill_s,
            }
        )
    return rows
