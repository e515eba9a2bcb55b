"""Roles the eviction views draw for ragged caches (KVzip, AdaKV, PyramidKV): a head's padding entries
(position -1) must never paint a role onto a real position, so a held sink reads as held."""

from __future__ import annotations

import pytest
import torch

from kvviz.capture.model_io import encode_prompt
from kvviz.eviction.held import role_map
from kvviz.eviction.policies import EVICTED, KEPT, PAD, SINK, Selection, make_policy
from kvviz.eviction.run import run_policy
from kvviz.figures.eviction import role_row, slot_table, timeline, token_strip

PROMPT = "The KV cache stores the keys and values of every token so that decoding does not recompute them. " * 6


def test_padding_never_writes_a_role_onto_position_zero():
    # head 0 keeps 0, 1, 2; head 1 keeps 0 and 3 and is padded with -1 once
    keep = torch.tensor([[[0, 1, 2], [0, 3, PAD]]])
    roles = torch.tensor([[[SINK, KEPT, KEPT], [SINK, KEPT, EVICTED]]])
    got = role_map(Selection(keep=keep, roles=roles), 4)
    assert got[0, 0].tolist() == [SINK, KEPT, KEPT, EVICTED]
    assert got[0, 1].tolist() == [SINK, EVICTED, EVICTED, KEPT]


@pytest.mark.parametrize("name", ["kvzip", "adakv", "pyramidkv"])
def test_a_held_position_zero_is_never_drawn_evicted(lm, name):
    ids = encode_prompt(lm, PROMPT, chat=True)
    policy = make_policy(name, **({} if name == "kvzip" else {"window_size": 16}))
    run = run_policy(lm, ids, policy, ratio=0.5, max_new_tokens=2)
    holding = [(layer, head) for layer, heads in enumerate(run.kept) for head, kept in enumerate(heads) if 0 in kept]
    assert holding, "no head holds position 0: the test says nothing"
    for layer, head in holding:
        for step in range(len(run.history)):
            assert role_row(run, layer, head, step)[0] != EVICTED, (layer, head, step)
        assert token_strip(run, layer, head)[0][1] != "evicted"
        table = slot_table(run, layer, head)
        assert table.loc[table["original position"] == 0, "role"].item() != "evicted"
    layer, head = holding[0]
    first = timeline(run, layer, head).data[0].customdata[:, 0]
    assert "evicted" not in set(first)
