"""The new token's keys and values appended twice: the query sees itself twice, and every later position
of that layer is one slot off."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvviz.capture.faults.base import Fault


@dataclass(frozen=True)
class AppendedTwice(Fault):
    name = "appended_twice"
    title = "append twice"
    source = (
        "the chapter's KVCache.append called both in the layer and in the loop: a decode loop with two owners "
        "of the append"
    )
    lesson = (
        "One token stored twice gets twice its share of attention and shifts the cache by a slot; exactly one "
        "owner (the cache's update) must append."
    )
    shows = "the struck layer's cache is one entry long at the struck step (cache length), its output jumps"
    first = "cache length"
    once = True

    def store(self, keys, values, layer):
        return torch.cat([keys, keys], dim=2), torch.cat([values, values], dim=2)  # [B, Hkv, 2q, D]
