"""The chapter's check on the real model: decoding with the cache equals recomputing without it.

After a run, the whole sequence goes through the model again from scratch, twice: once with kvviz's
capture attention function (so the attention outputs the recorder saw can be compared position by
position) and once without it (the model exactly as loaded, so a capture that changed the model's
output would show). Several finished runs are checked together: the first recomputation packs them
into one forward (:mod:`kvviz.capture.packed`), the second pads them on the right into one batch —
with causal attention a token never sees the padding after it, so every real position's logits are
its own.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache

from kvviz.capture.attention_fn import unpatched
from kvviz.capture.generation import Generation
from kvviz.capture.model_io import forward
from kvviz.capture.packed import Segment, packable, packed_forward
from kvviz.capture.recorder import Recorder, RecorderConfig
from kvviz.models import LoadedModel

BATCH_TOKENS = 4096  # padded tokens per unpatched recomputation forward (B × longest sequence)


def recompute(lm: LoadedModel, gens: Sequence[Generation]) -> list[dict]:
    """Full recomputation with the capture wrapper (inside ``installed``): per run, the largest logit
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
        rec = Recorder(g.trace.model.layers, g.trace.model.q_heads, len(fed), len(fed), cfg, lm.device, True)
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
    return [_compare(g, full, rec) for g, full, rec in zip(gens, fulls, recs)]


def _compare(g: Generation, full: torch.Tensor, rec: Recorder) -> dict:
    if g.rec is None:
        raise ValueError("The check needs a recorded run.")
    n = len(g.logits_seen)
    logit_diff = (full - torch.stack(g.logits_seen)).abs().max().item()
    out_diff = None
    outs = [o for o in g.rec.outputs if o is not None]
    full_out = rec.outputs[0]
    if full_out is not None and len(outs) == len(g.rec.outputs):
        ref = full_out[:, -n:]  # [Lyr, n, Hq*Dv]: outputs at the positions cached decoding produced
        mine = torch.cat([o[:, -1:] for o in outs], dim=1)  # last query of each forward
        out_diff = (ref - mine).abs().max().item()
    return {"max_abs_logit_diff": logit_diff, "max_abs_attn_output_diff": out_diff, "positions_checked": n}


def recompute_unpatched(lm: LoadedModel, gens: Sequence[Generation], timeout: float = 10.0) -> list[dict]:
    """Full recomputation by the model alone (outside ``installed``): per run, the largest logit
    difference against the cached run. Runs share padded forwards of at most :data:`BATCH_TOKENS`.
    When other runs keep the wrapper installed for ``timeout`` seconds, the recomputation runs with it
    (which changes no output) and says so (``unpatched_reference`` False)."""
    out: list[dict] = []
    with torch.inference_mode(), unpatched(lm.model, timeout) as alone:
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


def _unpatched_batch(lm: LoadedModel, gens: Sequence[Generation], alone: bool) -> list[dict]:
    feeds = [g.trace.token_ids[: g.trace.n_fed] for g in gens]
    keep = [len(g.logits_seen) for g in gens]
    if len(gens) == 1 or not packable(lm):
        fulls = [forward(lm, f, 0, DynamicCache(config=lm.config), None, logits_to_keep=n) for f, n in zip(feeds, keep)]
    else:
        width = max(len(f) for f in feeds)
        ids = torch.tensor([f + [f[-1]] * (width - len(f)) for f in feeds], device=lm.device)
        pos = torch.arange(width, device=lm.device)[None].expand(len(feeds), -1)
        hidden = lm.model.base_model(input_ids=ids, position_ids=pos, use_cache=False).last_hidden_state
        head = lm.model.get_output_embeddings()
        fulls = [head(hidden[b, len(f) - n : len(f)]).float() for b, (f, n) in enumerate(zip(feeds, keep))]
    return [
        {
            "_gen": g,
            "max_abs_logit_diff_vs_unpatched": (full - torch.stack(g.logits_seen)).abs().max().item(),
            "unpatched_reference": alone,
        }
        for g, full in zip(gens, fulls)
    ]
