"""The first-divergence finder: where a cached run first leaves its full recomputation, and by how much.

The equivalence check (:mod:`kvviz.capture.verify`) says whether a run matches; this says *where* it
stops matching. The cached run is driven once with hooks that only read — each forward's new keys and
values from its cache, each layer's attention output (the input of its output projection) at the last
query, the logits — and the fed sequence is then recomputed in one forward, the model as loaded, from
scratch. Per step × layer the differences are compared with a tolerance per dtype
(:func:`kvviz.capture.tolerance.divergence_tolerance`); the first (step, layer, KV head, position) where K, V, the attention output or the
cache's length leaves it is the first divergence (a step's layers in order, K and V before the output;
logits after every layer). Usage::

    from kvviz.capture.divergence import debug
    from kvviz.capture.faults import make_fault
    report = debug(lm, "Why is the sky blue?", make_fault("causal_decode", step=3, layer=5), max_new_tokens=8)
    report.first   # Divergence(step=3, layer=5, kv_head=…, position=…, quantity='attention output', …)

Command: ``python -m kvviz check --fault causal_decode --step 3 --layer 5 --json``.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from transformers import DynamicCache

from kvviz.capture.attention_fn import unpatched
from kvviz.capture.drive import forwards
from kvviz.capture.faults import Fault
from kvviz.capture.generation import Generation
from kvviz.capture.model_io import cache_kwarg
from kvviz.capture.options import CacheSetup, Decode, Feed, Recording
from kvviz.capture.tolerance import divergence_tolerance
from kvviz.capture.verify import output_projections
from kvviz.models import LoadedModel

OFF_SCALE = 1e6  # a cell whose cache length is wrong: no tolerance applies, drawn off the scale


@dataclass(frozen=True)
class Divergence:
    """Where a run first leaves its recomputation: the forward (0: the prefill), the layer (None: the logits),
    the KV head (None where the quantity has none), the sequence position, what left its tolerance, the
    |Δ| there (for a wrong cache length: entries held minus expected) and the tolerance it left."""

    step: int
    layer: int | None
    kv_head: int | None
    position: int
    quantity: str
    jump: float
    tolerance: float


@dataclass
class Report:
    """A run against its recomputation. ``ratio`` [steps, layers]: per cell the largest |Δ| / tolerance over
    K, V and the attention output (> 1: diverged; :data:`OFF_SCALE` for a wrong cache length); ``logit_ratio``
    [steps] likewise for the logits."""

    dtype: str
    tolerance: float
    n_prompt: int
    tokens: list[str]  # the run's generated tokens
    token_ids: list[int]
    reference_ids: list[int]  # the recomputation's argmax at every step, on the run's own tokens
    ratio: np.ndarray
    logit_ratio: np.ndarray
    first: Divergence | None
    tokens_changed_from: int | None  # the first step whose token the recomputation would not have chosen
    fault: dict | None = None
    clean_tokens: list[str] | None = None  # a fault-free run of the same prompt (the view's side-by-side)
    notes: list[str] = field(default_factory=list)

    @property
    def diverged(self) -> bool:
        return self.first is not None

    def to_json(self) -> dict:
        """Plain JSON: the first divergence, the token verdict and the map (rounded ratios)."""
        return {
            "diverged": self.diverged,
            "first": asdict(self.first) if self.first else None,
            "tokens_changed": self.tokens_changed_from is not None,
            "tokens_changed_from_step": self.tokens_changed_from,
            "dtype": self.dtype,
            "tolerance": self.tolerance,
            "tolerance_rule": "|Δ| ≤ √eps(dtype) × max(1, max |reference|), per step, layer and quantity",
            "n_prompt": self.n_prompt,
            "tokens": self.tokens,
            "clean_tokens": self.clean_tokens,
            "fault": self.fault,
            "map": np.round(np.minimum(self.ratio, OFF_SCALE), 4).tolist(),
            "logit_map": np.round(self.logit_ratio, 4).tolist(),
            "notes": self.notes,
        }


@dataclass
class _Run:
    """What the cached run produced, per forward that produced a token."""

    kv: list[list[tuple[int, torch.Tensor, torch.Tensor] | None]] = field(default_factory=list)  # length, new K, V
    outputs: list[dict[int, torch.Tensor]] = field(default_factory=list)  # layer -> [Hq·Dv] at the last query
    logits: list[torch.Tensor] = field(default_factory=list)
    fed: list[int] = field(default_factory=list)  # tokens fed per step (step 0: the whole prompt's cache)


def _snapshot(cache, whole: bool, fed: int) -> list[tuple[int, torch.Tensor, torch.Tensor] | None]:
    """Per layer: entries held, and the entries this forward wrote (all of them after the prefill)."""
    out: list[tuple[int, torch.Tensor, torch.Tensor] | None] = []
    for layer in cache.layers:
        k, v = getattr(layer, "keys", None), getattr(layer, "values", None)
        if not isinstance(k, torch.Tensor) or not isinstance(v, torch.Tensor) or k.dim() != 4 or k.numel() == 0:
            out.append(None)
            continue
        n = k.shape[2] if whole else min(fed, k.shape[2])
        out.append((k.shape[2], k[0, :, -n:].float().clone(), v[0, :, -n:].float().clone()))
    return out


def record_run(lm: LoadedModel, g: Generation) -> _Run:
    """Drive ``g`` to its end, reading (never changing) its cache, attention outputs and logits per step."""
    run, current, me = _Run(), {}, threading.get_ident()

    def hook(layer: int):
        def read(_module, args) -> None:
            if threading.get_ident() == me:
                current[layer] = args[0][0, -1].float().clone()

        return read

    handles = [p.register_forward_pre_hook(hook(i)) for i, p in output_projections(lm.model).items()]
    try:
        for f in forwards(lm, g):
            if not f.produced:
                continue
            first = not run.kv
            run.kv.append(_snapshot(g.cache, first, len(f.feed)))
            run.fed.append(len(f.feed))
            run.outputs.append(dict(current))
            run.logits.append(f.logits[-1].float().clone())
            current.clear()
    finally:
        for h in handles:
            h.remove()
    return run


def recompute(lm: LoadedModel, ids: list[int], steps: int):
    """The fed sequence from scratch, the model as loaded: every layer's K/V [Hkv, T, D] (as its cache holds
    them), the attention outputs at the last ``steps`` positions per layer, and their logits [steps, vocab]."""
    seen: dict[int, torch.Tensor] = {}
    me = threading.get_ident()

    def hook(layer: int):
        def read(_module, args) -> None:
            if threading.get_ident() == me:
                seen[layer] = args[0][0, -steps:].float()

        return read

    handles = [p.register_forward_pre_hook(hook(i)) for i, p in output_projections(lm.model).items()]
    cache = DynamicCache(config=lm.config)
    try:
        with torch.inference_mode(), unpatched(lm.model):
            x = torch.tensor([ids], device=lm.device)
            pos = torch.arange(len(ids), device=lm.device)[None]
            out = lm.model(
                input_ids=x, position_ids=pos, use_cache=True, logits_to_keep=steps, **{cache_kwarg(lm.model): cache}
            )
    finally:
        for h in handles:
            h.remove()
    kv: list[tuple[torch.Tensor, torch.Tensor] | None] = []
    for layer in cache.layers:
        k, v = getattr(layer, "keys", None), getattr(layer, "values", None)
        if isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor) and k.dim() == 4 and k.numel() > 0:
            kv.append((k[0].float(), v[0].float()))
        else:
            kv.append(None)
    return kv, seen, out.logits[0].float()


def _scaled(diff: torch.Tensor, ref: torch.Tensor, tol: float) -> torch.Tensor:
    return diff / (tol * max(1.0, float(ref.abs().max())))


def _kv_cell(mine, ref, n_fed: int, end: int, tol: float):
    """One layer after one step: (largest |Δ| / tolerance, the first (position, KV head, quantity, jump) beyond
    it or None). ``mine``: entries held and the last ones written, ending at position ``end`` − 1."""
    held, k, v = mine
    rk, rv = ref
    if rk.shape[1] == n_fed and held != end:  # a full layer holds exactly the positions fed so far
        return OFF_SCALE, (end - 1, None, "cache length", float(held - end))
    start_ref = n_fed - rk.shape[1]  # the first position the reference's layer holds (a sliding one: the last W)
    lo = max(end - k.shape[1], start_ref)
    if lo >= end:
        return 0.0, None
    a, b, n = lo - (end - k.shape[1]), lo - start_ref, end - lo
    worst, found = 0.0, None
    for name, x, r in (("K", k, rk), ("V", v, rv)):
        d = _scaled((x[:, a : a + n] - r[:, b : b + n]).abs().amax(-1), r[:, b : b + n], tol)  # [Hkv, n]
        worst = max(worst, float(d.max()))
        bad = (d > 1).nonzero()
        if len(bad):
            j = int(bad[:, 1].min())
            if found is None or lo + j < found[0]:
                h = int(d[:, j].argmax())
                found = (lo + j, h, name, float((x[h, a + j] - r[h, b + j]).abs().max()))
    return worst, found


def compare(run: _Run, ref, n_prompt: int, n_fed: int, dtype: torch.dtype, heads: tuple[int, int, int]):
    """The map, the first divergence and the reference's tokens (see :class:`Report`)."""
    ref_kv, ref_out, ref_logits = ref
    layers, q_heads, kv_heads = heads
    tol = divergence_tolerance(dtype)
    steps = len(run.logits)
    ratio = np.zeros((steps, layers))
    logit_ratio = np.zeros(steps)
    first: Divergence | None = None
    for s in range(steps):
        end = n_prompt + s  # positions in the cache after step s: 0 … end − 1 (the token fed last is end − 1)
        for i in range(layers):
            found = None
            mine = run.kv[s][i] if i < len(run.kv[s]) else None
            if mine is not None and i < len(ref_kv) and ref_kv[i] is not None:
                ratio[s, i], found = _kv_cell(mine, ref_kv[i], n_fed, end, tol)
            if i in run.outputs[s] and i in ref_out:
                r = ref_out[i][s]
                d = (run.outputs[s][i] - r).abs()  # [Hq·Dv]
                q = float(_scaled(d.max(), r, tol))
                ratio[s, i] = max(ratio[s, i], q)
                if found is None and q > 1:
                    found = (end - 1, _kv_head(d, q_heads, kv_heads), "attention output", float(d.max()))
            if found is not None and first is None:
                first = Divergence(s, i, found[1], found[0], found[2], found[3], tol)
        d = (run.logits[s] - ref_logits[s]).abs()
        logit_ratio[s] = float(_scaled(d.max(), ref_logits[s], tol))
        if first is None and logit_ratio[s] > 1:
            first = Divergence(s, None, None, n_prompt + s - 1, "logits", float(d.max()), tol)
    return ratio, logit_ratio, first, [int(x) for x in ref_logits.argmax(-1)]


def _kv_head(d: torch.Tensor, q_heads: int, kv_heads: int) -> int:
    """The KV head whose query group holds the largest |Δ| of an attention output [Hq·Dv]."""
    per_head = d.view(q_heads, -1).amax(-1)
    return int(per_head.argmax()) // max(1, q_heads // kv_heads)


def find(lm: LoadedModel, g: Generation) -> Report:
    """Drive a fresh ``g`` (greedy, ``record=False``; a fault or none) and compare it with its recomputation."""
    run = record_run(lm, g)
    trace = g.trace
    n_prompt, steps = trace.n_prompt, len(run.logits)
    n_fed = n_prompt + steps - 1
    ids = trace.token_ids[:n_fed]
    ref = recompute(lm, ids, steps)
    info = trace.model
    ratio, logit_ratio, first, ref_ids = compare(
        run, ref, n_prompt, n_fed, lm.dtype, (info.layers, info.q_heads, info.kv_heads)
    )
    produced = trace.token_ids[n_prompt:]
    changed = next((s for s, (a, b) in enumerate(zip(produced, ref_ids)) if a != b), None)
    fault = g.fault
    return Report(
        dtype=str(lm.dtype).removeprefix("torch."),
        tolerance=divergence_tolerance(lm.dtype),
        n_prompt=n_prompt,
        tokens=trace.tokens[n_prompt:],
        token_ids=produced,
        reference_ids=ref_ids,
        ratio=ratio,
        logit_ratio=logit_ratio,
        first=first,
        tokens_changed_from=changed,
        fault=describe(fault) if fault is not None else None,
    )


def describe(fault: Fault) -> dict:
    """A fault's name, where it strikes, its source and its lesson (JSON)."""
    return {
        "name": fault.name,
        "title": fault.title,
        "step": fault.step,
        "layer": None if fault.every_layer else fault.layer,
        **({"block": fault.block} if hasattr(fault, "block") else {}),
        "source": fault.source,
        "lesson": fault.lesson,
        "shows": fault.shows,
    }


def verdict(j: dict) -> str:
    """The report in two or three sentences (the command's text output and the view's verdict)."""
    lines = []
    f = j["first"]
    if f is None:
        lines.append(
            f"No divergence: every step and layer within tolerance ({j['tolerance']:.2g} × scale, {j['dtype']})."
        )
    else:
        where = "the logits" if f["layer"] is None else f"layer {f['layer']}"
        head = "" if f["kv_head"] is None else f", KV head {f['kv_head']}"
        size = (
            f"holds {abs(int(f['jump']))} entry {'more' if f['jump'] > 0 else 'fewer'} than positions fed"
            if f["quantity"] == "cache length"
            else f"|Δ| = {f['jump']:.3g} (tolerance {f['tolerance']:.2g} × scale)"
        )
        lines.append(
            f"First divergence: step {f['step']}, {where}{head}, position {f['position']}: {f['quantity']} {size}."
        )
    changed = j["tokens_changed_from_step"]
    lines.append(
        "The generated tokens are unchanged." if changed is None else f"The tokens change from step {changed}."
    )
    if j["fault"]:
        lines.append(j["fault"]["lesson"])
    return "\n".join(lines + j["notes"])


def debug(
    lm: LoadedModel,
    prompt: str,
    fault: Fault | None = None,
    *,
    chat: bool = True,
    max_new_tokens: int = 16,
    prompt_ids: list[int] | None = None,
    clean: bool = False,
) -> Report:
    """A greedy run of ``prompt`` with ``fault`` (None: none) against its recomputation; ``clean`` adds the
    tokens of a fault-free run (the side-by-side). A fully cached prompt's fault cuts the prompt to whole
    blocks (said in the notes)."""
    from kvviz.capture.faults import BLOCK, FullyCachedPrompt, check_fault
    from kvviz.capture.model_io import encode_prompt, model_info

    info = model_info(lm)
    notes = []
    if fault is not None:
        check_fault(fault, info.layers, max_new_tokens, info.sliding_window is not None)
        if isinstance(fault, FullyCachedPrompt):
            ids = list(prompt_ids) if prompt_ids is not None else encode_prompt(lm, prompt, chat)
            if len(ids) < BLOCK:
                raise ValueError(f"A fully cached prompt needs at least one whole {BLOCK}-token block.")
            if len(ids) % BLOCK:
                notes.append(
                    f"The prompt was cut from {len(ids)} to {len(ids) - len(ids) % BLOCK} tokens (whole blocks)."
                )
                ids = ids[: len(ids) - len(ids) % BLOCK]
            prompt_ids = ids

    def generation(f: Fault | None) -> Generation:
        return Generation(
            lm,
            prompt,
            feed=Feed(chat=chat, prompt_ids=prompt_ids),
            decode=Decode(max_new_tokens=max_new_tokens, stop_on_eos=False),
            recording=Recording(on=False),
            cache=CacheSetup(fault=f),
        )

    report = find(lm, generation(fault))
    report.notes = notes
    if clean:
        g = generation(None)
        for _ in forwards(lm, g):
            pass
        report.clean_tokens = g.trace.tokens[g.trace.n_prompt :]
    return report
