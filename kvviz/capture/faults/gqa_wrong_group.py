"""Grouped-query heads mapped to the wrong KV group: ``repeat`` (tile) where ``repeat_interleave`` is meant,
so query head h reads KV head h mod n_kv instead of h // (n_q / n_kv)."""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F

from kvviz.capture.faults.base import Fault


@dataclass(frozen=True)
class GqaWrongGroup(Fault):
    name = "gqa_wrong_group"
    title = "GQA heads in the wrong group"
    source = (
        "the chapter's attend(), which expands KV heads with repeat_interleave; awslabs/keys_values PR #83 "
        "reports the neighbouring grouped-query bug (a group's scores averaged, not summed)"
    )
    lesson = (
        "Query heads 0…g−1 share KV head 0: expanding KV heads with repeat tiles them (head h reads h mod n_kv); "
        "use repeat_interleave (transformers' repeat_kv)."
    )
    shows = "K and V agree; the struck layer's attention output jumps at the struck step"
    first = "attention output"

    def attend(self, module, query, key, value, scaling, window=None):
        groups = query.shape[1] // key.shape[1]
        if groups == 1:
            return None
        out = F.scaled_dot_product_attention(
            query, key.repeat(1, groups, 1, 1), value.repeat(1, groups, 1, 1), scale=scaling
        )  # [B, Hq, q, Dv], heads tiled
        return out.transpose(1, 2).contiguous()
