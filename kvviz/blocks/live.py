"""The paged views on the real model: prefill prompts and read their caches, or evict and count blocks.

Every model call goes through :func:`kvviz.capture.loop.forward` (prefill) or
:func:`kvviz.eviction.run.run_policy` (eviction), so the numbers come from real cache tensors.

    from kvviz.blocks.live import prefill_table, share_prompts, evict_and_page
    share_prompts(lm, [ids_a, ids_b], block_size=16).bytes_saved
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from kvviz.blocks.eviction import PAGE_ALIGNED_NOTE, EvictionPaging, from_run
from kvviz.blocks.sharing import Sharing, share
from kvviz.blocks.table import BlockTable, from_cache
from kvviz.capture.model_io import encode_prompt, forward, model_info
from kvviz.models import LoadedModel


def prefill_table(lm: LoadedModel, ids: Sequence[int], block_size: int) -> BlockTable:
    """One prefill of ``ids`` into a fresh cache; its block table, read from the cache's tensors."""
    if not ids:
        raise ValueError("The prompt is empty: type some text.")
    info = model_info(lm)
    if len(ids) > info.context_length > 0:
        raise ValueError(f"The prompt is {len(ids):,} tokens; the model's context is {info.context_length:,}.")
    cache = DynamicCache(config=lm.config)
    with torch.inference_mode():
        forward(lm, [int(i) for i in ids], 0, cache, None)
    return from_cache(cache, info.stored_heads, block_size, seen=len(ids))


def share_prompts(
    lm: LoadedModel,
    token_lists: Sequence[Sequence[int]],
    block_size: int,
    names: Sequence[str] = (),
    should_stop: Callable[[], bool] | None = None,
) -> Sharing:
    """Prefill every prompt on its own (the real cache bytes), then map them onto one shared pool."""
    tables = []
    for ids in token_lists:
        if should_stop is not None and should_stop():
            raise ValueError("Stopped at the time budget before every prompt was read; try shorter prompts.")
        tables.append(prefill_table(lm, ids, block_size))
    return share(token_lists, tables, names)


@dataclass(frozen=True)
class PolicyPaging:
    """One policy's prefill eviction on a prompt, and what it freed in blocks."""

    name: str
    title: str
    budget: int
    paging: EvictionPaging


def evict_and_page(
    lm: LoadedModel,
    ids: Sequence[int],
    policies: Sequence,
    budget: int,
    block_size: int,
    should_stop: Callable[[], bool] | None = None,
) -> list[PolicyPaging]:
    """Each policy compresses the prompt's prefill to ``budget`` entries per layer and KV head (no decoding)."""
    from kvviz.eviction.run import run_policy

    out = []
    for policy in policies:
        if should_stop is not None and should_stop():
            break
        run = run_policy(lm, list(ids), policy, budget=budget, max_new_tokens=1, record_history=False)
        out.append(PolicyPaging(policy.name, policy.title, run.n_kept, from_run(run, block_size)))
    return out


def blocks_report(
    lm, prompts: list[tuple[str, str]], chat: bool, block_size: int, policy=None, budget: int | None = None
) -> dict:
    """One to four named prompts as blocks, shared, and (with ``policy`` and ``budget``) evicted: the JSON
    answer of ``python -m kvviz blocks`` and of the Blocks tab's ``/blocks`` endpoint."""
    ids = [encode_prompt(lm, text, chat) for _, text in prompts]
    sharing = share_prompts(lm, ids, block_size, [name for name, _ in prompts])
    out = {
        "model": model_info(lm).name,
        "chat": chat,
        **sharing.to_json(),
        "bytes_per_token": sharing.prompts[0].table.bytes_per_token,
        "prompts": [],
    }
    for p in sharing.prompts:
        t = p.table
        row = {
            "name": p.name,
            "prompt_tokens": p.n_tokens,
            "token_ids": list(p.token_ids),
            "blocks": t.blocks_per_layer,
            "wasted_slots": t.wasted_slots,
            "wasted_slots_per_layer": t.wasted_slots_per_layer,
            "cached_blocks": p.cached_blocks,
            "block_ids": list(p.block_ids),
            "used_bytes": t.used_bytes,
            "paged_bytes": t.paged_bytes,
        }
        if policy is not None:
            if budget is None:
                raise ValueError("A policy needs a budget (--budget, tokens kept per layer and KV head).")
            paging = evict_and_page(lm, p.token_ids, [policy], budget, block_size)[0].paging
            row.update({k: v for k, v in paging.to_json().items() if k not in ("policy", "block_size")})
        out["prompts"].append(row)
    if policy is not None:
        out["policy"] = {"name": policy.name, "params": policy.params(), "budget": budget, "note": PAGE_ALIGNED_NOTE}
    return out
