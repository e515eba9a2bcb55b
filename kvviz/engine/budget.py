"""A room served under a KV budget: the real model, one batch per step, replayed step by step.

The chapter's claim — KV memory, not compute, caps how many sequences decode together, and a smaller
cache per sequence means more of them — measured on the bundled model instead of computed. A replay
serves a trace of requests (each arriving at a given step, as the load bench's waves do) under a KV
budget in bytes, in one of the ways to spend it (:mod:`kvviz.engine.budget_ledger`): admission waits
until the head of the queue fits (first come, first served), every running sequence decodes in one
packed forward per step (:mod:`kvviz.capture.packed`), greedily. A paged mode takes blocks as sequences
grow; when the running ones need more than is free, the latest admitted is preempted — its blocks
freed, its prompt and answer so far recomputed when it is admitted again, as vLLM does — and the event
says which sequence and why. After every forward the bytes are checked against the budget from the
cache tensors themselves (their entries' count and element size): each sequence's tensors fit inside
what the ledger charges it, and everything charged fits the budget.

Deterministic in steps (arrivals, admissions, preemptions, answers: greedy), so a stored replay is
reproducible; only the seconds are the machine's. Lossless modes' answers equal each request's solo
run (:func:`solo_runs`); the KIVI mode's are compared with them (agreement), not required to equal.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch

from kvviz.capture.attention_fn import installed
from kvviz.capture.generation import Generation
from kvviz.capture.model_io import forward, model_info
from kvviz.capture.options import CacheSetup, Decode, Feed, Recording
from kvviz.capture.packed import Segment, packable, packed_forward
from kvviz.engine.budget_ledger import LOSSY, PAGED, Ledger, SharedPool, Split, check_mode, kivi_scheme
from kvviz.engine.budget_trace import Request, prompt_ids, summarize
from kvviz.engine.few_rows import few_rows, prepare
from kvviz.limits import (
    MAX_KV_BUDGET_BYTES,
    MAX_KV_BUDGET_NEW_TOKENS,
    MAX_KV_BUDGET_REQUESTS,
    MAX_KV_BUDGET_STEPS,
    MIN_KV_BUDGET_BYTES,
    bounded_int,
)
from kvviz.models import LoadedModel
from kvviz.quant.cache import cache_factory
from kvviz.units import format_bytes


@dataclass
class _Seq:
    """A request while it is served (possibly in several incarnations, after preemptions)."""

    i: int
    req: Request
    prompt: list[int]
    produced: list[int] = field(default_factory=list)
    gen: Generation | None = None
    charged: int = 0  # bytes the ledger charges it now (a reservation, or its private blocks)
    hashes: list[bytes] = field(default_factory=list)  # its prompt blocks in the shared pool (paged+prefix)
    arrived_s: float | None = None
    admitted: int | None = None
    first_step: int | None = None
    first_s: float | None = None
    done_step: int | None = None
    preemptions: int = 0
    recomputed: int = 0  # tokens computed again after its preemptions


def check_trace(requests: Sequence[Request], budget: int) -> None:
    bounded_int(budget, "KV budget (bytes)", MIN_KV_BUDGET_BYTES, MAX_KV_BUDGET_BYTES)
    bounded_int(len(requests), "requests", 1, MAX_KV_BUDGET_REQUESTS)
    for r in requests:
        bounded_int(r.max_new_tokens, "max_new_tokens", 1, MAX_KV_BUDGET_NEW_TOKENS)
        bounded_int(r.arrival, "arrival step", 0, MAX_KV_BUDGET_STEPS)


class BudgetError(RuntimeError):
    """The bytes held passed the budget, or a sequence's tensors passed what it was charged: a replay bug."""


class _Replay:
    """One replay's state; :func:`replay` drives it."""

    def __init__(self, lm: LoadedModel, requests: Sequence[Request], budget: int, mode: str, max_batch: int):
        self.lm, self.budget, self.mode, self.max_batch = lm, budget, check_mode(mode), max_batch
        self.ledger = Ledger(model_info(lm), mode)
        self.pool = SharedPool(self.ledger.block, self.ledger.block * self.ledger.per_token)
        self.seqs = [_Seq(i, r, prompt_ids(lm, r)) for i, r in enumerate(requests)]
        peak = max(self.ledger.peak(len(s.prompt), s.req.max_new_tokens) for s in self.seqs)
        if peak > budget:
            raise ValueError(
                f"A KV budget of {format_bytes(budget)} holds no request in mode {mode}: the longest needs "
                f"{format_bytes(peak)}."
            )
        self.waiting: deque[_Seq] = deque(sorted(self.seqs, key=lambda s: (s.req.arrival, s.i)))
        self.running: list[_Seq] = []
        self.step, self.clock = 0, 0.0
        self.steps: list[dict] = []
        self.events: list[dict] = []
        self.packable = packable(lm)
        prepare(lm)  # as the engine does: a packed step's linears may take the few-rows route

    @property
    def used(self) -> int:
        return sum(s.charged for s in self.running) + (self.pool.nbytes if self.mode == "paged+prefix" else 0)

    def shared_tokens(self, s: _Seq) -> int:
        return len(s.hashes) * self.ledger.block

    # ---- admission -----------------------------------------------------------------------------------
    def admit(self, preempted: bool) -> list[int]:
        """Admit waiting requests in order while the head fits (none in a step that preempted, as vLLM)."""
        for s in self.waiting:
            if s.arrived_s is None and s.req.arrival <= self.step:
                s.arrived_s = self.clock
        out: list[int] = []
        while not preempted and self.waiting and len(self.running) < self.max_batch:
            s = self.waiting[0]
            if s.req.arrival > self.step or not self._fits(s):
                break
            self.waiting.popleft()
            self._start(s)
            out.append(s.i)
        return out

    def _ids(self, s: _Seq) -> list[int]:
        return s.prompt + s.produced  # a preempted sequence recomputes its answer so far with its prompt

    def _fits(self, s: _Seq) -> bool:
        ids, mode = self._ids(s), self.mode
        if mode.startswith("contiguous"):
            need = self.ledger.reserve(len(s.prompt), s.req.max_new_tokens)
        elif mode == "paged+prefix":
            hashes = self.pool.hashes(ids)
            if self.pool.pending(hashes):
                return False  # its leading blocks are being computed this step: read them next step instead
            need = self.ledger.private(len(ids) - len(hashes) * self.ledger.block) + self.pool.new_bytes(hashes)
        else:
            need = self.ledger.private(len(ids))
        return self.used + need <= self.budget

    def _start(self, s: _Seq) -> None:
        ids = self._ids(s)
        left = s.req.max_new_tokens - len(s.produced)
        factory = cache_factory(kivi_scheme()) if self.mode in LOSSY else None
        g = Generation(
            self.lm,
            s.req.prompt,
            feed=Feed(prompt_ids=ids, prefill_chunk=0),
            decode=Decode(max_new_tokens=left),
            recording=Recording(on=False),
            cache=CacheSetup(factory=factory),
        )
        s.gen, s.admitted = g, s.admitted if s.admitted is not None else self.step
        if s.produced:
            s.recomputed += len(ids)
        if self.mode.startswith("contiguous"):
            s.charged = self.ledger.reserve(len(s.prompt), s.req.max_new_tokens)
        elif self.mode == "paged+prefix":
            s.hashes = self.pool.hashes(ids)
            hit = self.pool.hits(s.hashes)
            self.pool.take(s.i, s.hashes)
            if hit:
                self._restore(s, hit)
            s.charged = self.ledger.private(len(ids) - self.shared_tokens(s))
        else:
            s.charged = self.ledger.private(len(ids))
        self.running.append(s)

    def _restore(self, s: _Seq, hit: int) -> None:
        """The first ``hit`` shared blocks' keys and values, from a running sequence whose cache holds them."""
        holder_i = self.pool.holder(s.hashes[hit - 1], {r.i for r in self.running})
        holder = self.seqs[holder_i] if holder_i is not None else None
        if holder is None or holder.gen is None:
            raise BudgetError(f"shared blocks of sequence {s.i} have no running holder.")
        n = hit * self.ledger.block
        layers = [(k[:, :, :n], v[:, :, :n]) for k, v in _layer_tensors(holder.gen.cache)]
        assert s.gen is not None
        s.gen.restore_prefix(layers, None)

    # ---- growth and preemption -----------------------------------------------------------------------
    def grow(self) -> list[int]:
        """Charge every running sequence for this step's feed; while the sum passes the budget, preempt the
        latest admitted (vLLM's recompute preemption). The preempted sequences, in order."""
        if self.mode not in PAGED:
            return []
        out: list[int] = []
        while True:
            after = {s.i: self._charge_after(s) for s in self.running}
            total = sum(after.values()) + (self.pool.nbytes if self.mode == "paged+prefix" else 0)
            if total <= self.budget:
                for s in self.running:
                    s.charged = after[s.i]
                return out
            victim = self.running[-1]
            needer = max(self.running, key=lambda s: after[s.i] - s.charged)
            self._preempt(victim, needer, after[needer.i] - needer.charged, total)
            out.append(victim.i)

    def _charge_after(self, s: _Seq) -> int:
        g = s.gen
        assert g is not None
        fed = g.trace.n_prompt - g.fed if g.prefilling else 1
        return self.ledger.private(g.fed + fed - self.shared_tokens(s))

    def _preempt(self, victim: _Seq, needer: _Seq, need: int, total: int) -> None:
        g = victim.gen
        assert g is not None
        self.events.append(
            {
                "step": self.step,
                "preempted": victim.i,
                "why": (
                    f"sequence {needer.i} needed {format_bytes(need)} more for its next token; the running "
                    f"sequences would hold {format_bytes(total)} of the {format_bytes(self.budget)} budget, so the "
                    f"latest admitted, {victim.i}, gave back {format_bytes(victim.charged)} and will recompute "
                    f"{len(self._ids(victim))} tokens"
                ),
                "freed_bytes": victim.charged,
            }
        )
        self._leave(victim)
        victim.preemptions += 1
        self.waiting.appendleft(victim)

    def _leave(self, s: _Seq) -> None:
        self.running.remove(s)
        if self.mode == "paged+prefix":
            self.pool.leave(s.i, s.hashes)
        if s.gen is not None:
            s.gen.release()
        s.gen, s.charged, s.hashes = None, 0, []

    # ---- the step ------------------------------------------------------------------------------------
    def forward(self) -> tuple[int, int, float]:
        """One packed forward of every running sequence's feed; (tokens fed, tokens produced, seconds)."""
        feeds = []
        for s in self.running:
            assert s.gen is not None
            ids, start = s.gen.next_feed(None)
            feeds.append((s, ids, start))
        t0 = time.perf_counter()
        if self.packable and len(feeds) > 1:
            segments = [Segment(ids, start, s.gen.cache) for s, ids, start in feeds if s.gen is not None]
            with few_rows():  # the engine's route for a packed step's few rows per weight
                rows = [x[-1] for x in packed_forward(self.lm, segments)]
        else:
            rows = [forward(self.lm, ids, start, s.gen.cache, None)[-1] for s, ids, start in feeds if s.gen]
        seconds = time.perf_counter() - t0
        self.clock += seconds
        produced = 0
        for (s, ids, _), row in zip(feeds, rows):
            g = s.gen
            assert g is not None
            was_prefilling = g.prefilling
            if g.take(row, len(ids)):
                produced += 1
                s.produced.append(g.trace.token_ids[-1])
                if s.first_step is None:
                    s.first_step, s.first_s = self.step, self.clock - (s.arrived_s or 0.0)
            if was_prefilling and self.mode == "paged+prefix":
                self.pool.computed(s.i, s.hashes)
        return sum(len(ids) for _, ids, _ in feeds), produced, seconds

    def check_and_split(self) -> tuple[Split, int]:
        """The bytes of this step from the cache tensors; :class:`BudgetError` when they pass what is charged."""
        split, tensors = Split(), 0
        for s in self.running:
            assert s.gen is not None
            tokens, nbytes = _cache_bytes(s.gen.cache)
            private = tokens - self.shared_tokens(s)
            element = nbytes // max(1, tokens * self.ledger.per_token // self.ledger.element)
            real = nbytes * private // tokens if self.mode not in LOSSY else self.ledger.tensor_bytes(private, element)
            if real > s.charged:
                raise BudgetError(f"step {self.step}: sequence {s.i}'s cache holds {real} bytes, charged {s.charged}.")
            tensors += real
            compressed = self.ledger.compressed_part(private)
            split.compressed += compressed
            split.held += real - compressed if self.mode in LOSSY else real
            split.empty += s.charged - real
        if self.mode == "paged+prefix":
            split.shared = self.pool.nbytes
            tensors += split.shared
        if tensors > self.budget or split.total > self.budget or split.total != self.used:
            raise BudgetError(
                f"step {self.step}: {split.total} bytes held ({tensors} in tensors), budget {self.budget}."
            )
        return split, tensors

    def finish(self) -> list[int]:
        done = [s for s in self.running if s.gen is not None and s.gen.done]
        for s in done:
            s.done_step = self.step
            self._leave(s)
        return [s.i for s in done]


def _layer_tensors(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    out = []
    for layer in cache.layers:
        k, v = getattr(layer, "keys", None), getattr(layer, "values", None)
        if not isinstance(k, torch.Tensor) or not isinstance(v, torch.Tensor):
            raise BudgetError("a running sequence's cache layer holds no key and value tensors.")
        out.append((k, v))
    return out


def _cache_bytes(cache) -> tuple[int, int]:
    """A cache's entries per layer (every layer alike) and the bytes of its key and value tensors, all layers."""
    tensors = _layer_tensors(cache)
    lens = {int(k.shape[-2]) for k, _ in tensors}
    if len(lens) != 1:
        raise BudgetError(f"a cache's layers hold different numbers of entries: {sorted(lens)}.")
    return lens.pop(), sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in tensors)


def replay(lm: LoadedModel, requests: Sequence[Request], budget: int, mode: str, max_batch: int = 64) -> dict:
    """Serve ``requests`` under ``budget`` bytes of KV in ``mode`` (see the module docstring); the replay as a
    JSON-ready dict: ``steps`` (per step: running sequences, tokens, bytes by kind, preemptions, seconds),
    ``requests`` (per request: steps and seconds to the first token, answer, preemptions), ``events``
    (each preemption and why) and ``summary``. ValueError when the budget holds no request at all."""
    check_trace(requests, budget)
    r = _Replay(lm, requests, budget, mode, bounded_int(max_batch, "max_batch", 1, MAX_KV_BUDGET_REQUESTS))
    with torch.inference_mode(), installed(lm.model):
        while r.waiting or r.running:
            if r.step > MAX_KV_BUDGET_STEPS:
                raise BudgetError(f"the replay passed {MAX_KV_BUDGET_STEPS} steps.")
            preempted = r.grow()
            admitted = r.admit(bool(preempted))
            if not r.running:
                r.step = max(r.step + 1, r.waiting[0].req.arrival if r.waiting else 0)
                continue
            fed, produced, seconds = r.forward()
            split, tensors = r.check_and_split()
            running = len(r.running)
            finished = r.finish()
            r.steps.append(
                {
                    "step": r.step,
                    "running": running,
                    "waiting": sum(1 for s in r.waiting if s.req.arrival <= r.step),
                    "fed_tokens": fed,
                    "new_tokens": produced,
                    "bytes": asdict(split),
                    "tensor_bytes": tensors,
                    "admitted": admitted,
                    "preempted": preempted,
                    "finished": finished,
                    "seconds": seconds,
                }
            )
            r.step += 1
    return _report(r, lm)


def _report(r: _Replay, lm: LoadedModel) -> dict:
    tok = lm.tokenizer
    reqs = [
        {
            "index": s.i,
            "prompt": s.req.prompt,
            "prompt_tokens": len(s.prompt),
            "arrival": s.req.arrival,
            "admitted": s.admitted,
            "first_token_steps": (s.first_step or 0) - s.req.arrival + 1,
            "first_token_s": s.first_s,
            "finished": s.done_step,
            "preemptions": s.preemptions,
            "recomputed_tokens": s.recomputed,
            "answer_ids": s.produced,
            "answer": tok.decode(s.produced, skip_special_tokens=True),
        }
        for s in r.seqs
    ]
    return {
        "mode": r.mode,
        "budget": r.budget,
        "block_tokens": r.ledger.block,
        "per_token_bytes": r.ledger.per_token,
        "steps": r.steps,
        "requests": reqs,
        "events": r.events,
        "summary": summarize(r.steps, reqs),
    }
