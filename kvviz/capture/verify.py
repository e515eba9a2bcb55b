"""The chapter's check on the real model: decoding with the cache equals recomputing without it.

After a run, the whole sequence goes through the model again from scratch, the model exactly as
loaded (no cache, no kvviz capture), and its logits and attention outputs (read by a hook on each
layer's output projection) are compared with what the cached, captured run produced. Agreement
settles both questions at once: the cache changed nothing and the capture changed nothing. A
disagreement is attributed by a second recomputation through kvviz's capture attention function
(:func:`recompute`): if that one agrees with the cached run, the cache is right and the capture
changed the model. Models without a recognisable output projection always get both
recomputations (the attention outputs then come from the capture).

Several finished runs are checked together: the model-as-loaded recomputation pads them on the
right into one batch (with causal attention a token never sees the padding after it, so every real
position's logits are its own), the capture's packs them into one forward
(:mod:`kvviz.capture.packed`). Runs of one batch that begin with the same tokens — a room's chat
template and system prompt — compute those leading rows once, from scratch, for all of them: a row
depends only on the tokens up to it, so they are every run's own rows, and each run's later rows
attend to them as in a forward of its own. A room's chat runs share most of their prompt, so this
roughly halves a room's check. The result says how many tokens were shared.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import torch
from transformers import DynamicCache

from kvviz.capture.attention_fn import installed, unpatched
from kvviz.capture.generation import Generation
from kvviz.capture.model_io import cache_kwarg, forward
from kvviz.capture.packed import Segment, packable, packed_forward
from kvviz.capture.recorder import Recorder, RecorderConfig
from kvviz.capture.tolerance import agreement
from kvviz.models import LoadedModel, attention_modules

BATCH_TOKENS = 4096  # tokens per recomputation forward (padded: B × longest sequence)
MIN_SHARED = 8  # fewest leading tokens worth a forward of their own in a padded check
PROJECTIONS = ("o_proj", "c_proj", "out_proj", "dense")  # an attention layer's output projection, by model family


def recompute(lm: LoadedModel, gens: Sequence[Generation]) -> list[dict]:
    """Full recomputation through the capture wrapper (inside ``installed``): per run, the largest logit
    and attention-output differences against what the cached run produced. Runs share packed
    forwards of at most :data:`BATCH_TOKENS` tokens."""
    out: list[dict] = []
    group: list[Generation] = []
    for g in gens:
        if group and sum(x.trace.n_fed for x in group) + g.trace.n_fed > BATCH_TOKENS:
            out.extend(_recompute(lm, group))
            group = []
        group.append(g)
    if group:
        out.extend(_recompute(lm, group))
    return out


def _recompute(lm: LoadedModel, gens: Sequence[Generation]) -> list[dict]:
    recs, feeds = [], []
    for g in gens:
        fed = g.trace.token_ids[: g.trace.n_fed]
        cfg = RecorderConfig(bin_factor=g.trace.bin_factor)
        info = g.trace.model
        rec = Recorder(info.layers, info.q_heads, len(fed), len(fed), cfg, lm.device, True, info.attention_layers)
        rec.begin_forward("outputs", len(fed))
        recs.append(rec)
        feeds.append(fed)
    keep = [len(g.logits_seen) for g in gens]
    if len(gens) == 1 or not packable(lm):
        fulls = [
            forward(lm, f, 0, DynamicCache(config=lm.config), r, logits_to_keep=n) for f, r, n in zip(feeds, recs, keep)
        ]
    else:
        segments = [Segment(f, 0, DynamicCache(config=lm.config), r) for f, r in zip(feeds, recs)]
        fulls = packed_forward(lm, segments, keep)
    return [_compare(lm, g, full, rec) for g, full, rec in zip(gens, fulls, recs)]


def _compare(lm: LoadedModel, g: Generation, full: torch.Tensor, rec: Recorder) -> dict:
    if g.rec is None:
        raise ValueError("The check needs a recorded run.")
    n = len(g.logits_seen)
    cached = torch.stack(g.logits_seen)
    logit_diff = (full - cached).abs().max().item()
    full_out = rec.outputs[0]
    out_diff = _output_diff(_cached_outputs(g), full_out[:, -n:] if full_out is not None else None)
    return {
        "max_abs_logit_diff": logit_diff,
        "max_abs_attn_output_diff": out_diff,
        "positions_checked": n,
        **agreement(full, cached, lm.dtype, g.trace.model.layers),
    }


def _cached_outputs(g: Generation) -> torch.Tensor | None:
    """The attention outputs the cached run produced at the positions it generated from,
    [Lyr, n, Hq·Dv] (the last query of each forward); None where legacy attention handed over none."""
    if g.rec is None:
        raise ValueError("The check needs a recorded run.")
    outs = [o for o in g.rec.outputs if o is not None]
    if not outs or len(outs) != len(g.rec.outputs):
        return None
    return torch.cat([o[:, -1:] for o in outs], dim=1)


def _output_diff(mine: torch.Tensor | None, ref: torch.Tensor | None) -> float | None:
    """Largest |Δ| between the cached run's attention outputs ``mine`` (:func:`_cached_outputs`) and a
    recomputation's ``ref`` at the same positions; None when either side has none (or they do not line up)."""
    if ref is None or mine is None or ref.shape != mine.shape:
        return None
    return (ref - mine).abs().max().item()


def check(lm: LoadedModel, gens: Sequence[Generation], timeout: float = 10.0) -> list[dict]:
    """The equivalence check of finished, recorded runs (see the module docstring): per run, the
    largest logit and attention-output differences against a full recomputation, and whether that
    recomputation ran on the model as loaded (``unpatched_reference``: False when other runs kept the
    capture installed for ``timeout`` seconds; it then ran with the wrapper, which changes no output).

    Call it outside :func:`~kvviz.capture.attention_fn.installed`; it installs the capture itself
    for the second recomputation, when one is needed."""
    with torch.inference_mode():
        out = _unpatched(lm, gens, timeout)
        unread = [res.pop("_outputs_unread") for res in out]
        again = [(g, res) for g, res, u in zip(gens, out, unread) if u or res["max_abs_logit_diff"] >= res["tolerance"]]
        if again:
            with installed(lm.model, state_layers=gens[0].trace.model.attention_layers is not None):
                for (_, res), through in zip(again, recompute(lm, [g for g, _ in again])):
                    res.update(through, recomputations=2)
    return out


def _unpatched(lm: LoadedModel, gens: Sequence[Generation], timeout: float) -> list[dict]:
    """The model-as-loaded recomputation, in padded batches of at most :data:`BATCH_TOKENS` tokens."""
    out: list[dict] = []
    with unpatched(lm.model, timeout) as alone:
        batch: list[Generation] = []
        for g in sorted(gens, key=lambda g: g.trace.n_fed):
            if batch and (len(batch) + 1) * g.trace.n_fed > BATCH_TOKENS:
                out.extend(_unpatched_batch(lm, batch, alone))
                batch = []
            batch.append(g)
        if batch:
            out.extend(_unpatched_batch(lm, batch, alone))
    by_gen = {id(d.pop("_gen")): d for d in out}
    return [by_gen[id(g)] for g in gens]


def output_projections(model) -> dict[int, torch.nn.Module]:
    """Each attention layer's output projection (its input is the layer's attention output,
    [B, q, Hq·Dv]), by layer index; empty when a layer has none kvviz recognises."""
    found = {}
    for module in attention_modules(model):
        proj = next(
            (getattr(module, n) for n in PROJECTIONS if isinstance(getattr(module, n, None), torch.nn.Module)), None
        )
        if proj is None:
            return {}
        found[module.layer_idx] = proj
    return found


def shared_prefix(feeds: Sequence[Sequence[int]], keep: Sequence[int]) -> int:
    """How many leading tokens every feed of a padded check shares and may compute once: their common
    prefix, short of every run's checked rows (they must come out of the batched forward), 0 when under
    :data:`MIN_SHARED` or for a single run."""
    if len(feeds) < 2:
        return 0
    n = min(len(f) - k for f, k in zip(feeds, keep))
    first = feeds[0]
    for f in feeds[1:]:
        n = next((i for i in range(n) if f[i] != first[i]), n)
    return n if n >= MIN_SHARED else 0


def _padded_hidden(lm: LoadedModel, feeds: Sequence[Sequence[int]], shared: int, on: list[bool]) -> torch.Tensor:
    """The last hidden states of every feed's positions ``shared…`` ([B, longest − shared, hidden]), padded
    on the right; the ``shared`` leading tokens, the same in every feed, go through the model once first
    (``on[0]`` is False during that forward, so the output-projection hooks skip it)."""
    width = max(len(f) for f in feeds)
    ids = torch.tensor([list(f) + [f[-1]] * (width - len(f)) for f in feeds], device=lm.device)
    pos = torch.arange(width, device=lm.device)[None].expand(len(feeds), -1)
    base = lm.model.base_model
    past = None
    if shared:
        on[0] = False
        past = DynamicCache(config=lm.config)
        base(input_ids=ids[:1, :shared], position_ids=pos[:1, :shared], use_cache=True, **{cache_kwarg(base): past})
        past.batch_repeat_interleave(len(feeds))
        on[0] = True
    kw = {cache_kwarg(base): past} if past is not None else {}
    return base(
        input_ids=ids[:, shared:], position_ids=pos[:, shared:], use_cache=past is not None, **kw
    ).last_hidden_state


def _unpatched_batch(lm: LoadedModel, gens: Sequence[Generation], alone: bool) -> list[dict]:
    feeds = [g.trace.token_ids[: g.trace.n_fed] for g in gens]
    keep = [len(g.logits_seen) for g in gens]
    seen: dict[int, list[torch.Tensor]] = {}  # layer -> per run, the attention outputs at its checked positions
    padded = len(gens) > 1 and packable(lm)
    shared = shared_prefix(feeds, keep) if padded else 0
    current: list[int] = [0]  # which run an unpadded forward is for
    on = [True]  # False while the shared prefix's forward runs (its rows hold no checked position)
    me = threading.get_ident()  # module hooks see every thread's forwards on this shared model: only ours count

    def hook(layer: int):
        def read(_module, args) -> None:
            if threading.get_ident() != me or not on[0]:
                return
            x = args[0]
            if padded:
                seen[layer] = [
                    x[b, len(f) - shared - n : len(f) - shared].float().to(lm.device)
                    for b, (f, n) in enumerate(zip(feeds, keep))
                ]
            else:
                n = keep[current[0]]
                seen.setdefault(layer, []).append(x[0, -n:].float().to(lm.device))

        return read

    handles = [proj.register_forward_pre_hook(hook(i)) for i, proj in output_projections(lm.model).items()]
    try:
        if not padded:
            fulls = []
            for i, (f, n) in enumerate(zip(feeds, keep)):
                current[0] = i
                fulls.append(forward(lm, f, 0, DynamicCache(config=lm.config), None, logits_to_keep=n))
        else:
            hidden = _padded_hidden(lm, feeds, shared, on)
            # every run's checked rows through the output head in one product: per run, the head's
            # [vocab, hidden] weight would be read again for a dozen rows (most of the check's time
            # after the layers, on a CPU)
            rows = torch.cat(
                [hidden[b, len(f) - shared - n : len(f) - shared] for b, (f, n) in enumerate(zip(feeds, keep))]
            )
            fulls = list(lm.model.get_output_embeddings()(rows).float().split(keep))
    finally:
        for h in handles:
            h.remove()
    results = []
    for b, (g, full) in enumerate(zip(gens, fulls)):
        cached = torch.stack(g.logits_seen)
        diff = (full - cached).abs().max().item()
        layers = [seen[i][b] for i in sorted(seen)] if len(seen) == g.trace.model.layers else None
        same = layers is not None and len({tuple(x.shape) for x in layers}) == 1
        mine = _cached_outputs(g)
        out_diff = _output_diff(mine, torch.stack(layers) if layers is not None and same else None)
        results.append(
            {
                "_gen": g,
                "_outputs_unread": out_diff is None and mine is not None,
                "max_abs_logit_diff": diff,
                "max_abs_attn_output_diff": out_diff,
                "positions_checked": len(g.logits_seen),
                "max_abs_logit_diff_vs_unpatched": diff,
                "unpatched_reference": alone,
                "recomputations": 1,
                "shared_prefix_tokens": shared,
                **agreement(full, cached, lm.dtype, g.trace.model.layers),
            }
        )
    return results
