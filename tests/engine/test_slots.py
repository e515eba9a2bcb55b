"""The room's slot buffers: a slotted cache holds exactly what its own cache would, and a freed slot shows
nothing of its last run."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from kvviz.capture.model_io import cache_layer_bytes
from kvviz.engine.engine import Engine
from kvviz.engine.handle import wait_all
from kvviz.engine.slots import SlotKV, SlotLayer

LAYERS, HKV, D = 2, 3, 4


def empty_cache() -> DynamicCache:
    cache = DynamicCache()
    cache.layers[:] = [DynamicLayer() for _ in range(LAYERS)]
    return cache


def kv(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(1, HKV, n, D), torch.randn(1, HKV, n, D)


def test_a_slotted_cache_holds_what_its_own_cache_would():
    torch.manual_seed(0)
    store = SlotKV(LAYERS, slots=3, capacity=16)
    mine, ref = [empty_cache(), empty_cache()], [empty_cache(), empty_cache()]
    assert all(store.attach(c, 10) for c in mine)
    for c, r, n in zip(mine, ref, (3, 5)):  # prompts of different lengths, one update each
        for layer in range(LAYERS):
            k, v = kv(n)
            c.update(k, v, layer)
            r.update(k, v, layer)
    for _ in range(2):  # decode steps: one new entry each, both sequences in one write per layer
        for layer in range(LAYERS):
            k, v = torch.randn(1, HKV, 2, D), torch.randn(1, HKV, 2, D)  # a packed row: sequence 0, then 1
            store.append(layer, [c.layers[layer] for c in mine], k, v, rows=[0, 1])
            for j, r in enumerate(ref):
                r.update(k[:, :, j : j + 1], v[:, :, j : j + 1], layer)
    for c, r in zip(mine, ref):
        assert c.get_seq_length() == r.get_seq_length()
        assert cache_layer_bytes(c) == cache_layer_bytes(r)  # counted from the slot's length, not from views
        for a, b in zip(c.layers, r.layers):
            assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
    key, value, lens = store.batch(0, [c.layers[0] for c in mine])
    assert lens == [5, 7] and key.shape == (2, HKV, 7, D)
    assert key.untyped_storage().data_ptr() == store.keys[0].untyped_storage().data_ptr()  # adjacent slots: a view
    assert torch.equal(key[1], ref[1].layers[0].keys[0]) and torch.equal(value[0, :, :5], ref[0].layers[0].values[0])
    swapped, _, lens = store.batch(0, [mine[1].layers[0], mine[0].layers[0]])  # out of slot order: gathered
    assert lens == [7, 5] and torch.equal(swapped[0], key[1])


def test_a_freed_slot_shows_nothing_of_its_last_run():
    store = SlotKV(LAYERS, slots=1, capacity=8)
    first = empty_cache()
    assert store.attach(first, 8)
    first.update(*kv(6), 0)
    assert not store.attach(empty_cache(), 8)  # the one slot is taken
    store.detach(first)
    assert type(first.layers[0]) is DynamicLayer and first.get_seq_length() == 0
    assert store.keys == [None] * LAYERS  # the room left: its buffers went with it
    second = empty_cache()
    assert store.attach(second, 8) and isinstance(second.layers[0], SlotLayer) and second.layers[0].slot == 0
    k, v = kv(2)
    second.update(k, v, 0)
    assert second.get_seq_length() == 2 and torch.equal(second.layers[0].keys, k)
    store.detach(empty_cache())  # a cache without a slot: nothing happens
    assert second.layers[0].store is store


def test_long_runs_and_used_caches_keep_their_own_cache():
    store = SlotKV(LAYERS, slots=2, capacity=8)
    assert not store.attach(empty_cache(), 9)  # longer than a slot
    used = empty_cache()
    used.update(*kv(1), 0)
    assert not store.attach(used, 4)  # already holds entries
    assert not store.attach(DynamicCache(), 4)  # no layers to take over
    assert store._free == [0, 1]


def test_the_engine_decodes_short_runs_in_slots_and_frees_them(lm):
    engine = Engine(lm, prefix_cache_bytes=0, gather_s=0.5, gather_max_s=5.0)  # the three start together
    seen = []
    real = engine._step_inference

    def spy(batch):
        seen.append([isinstance(j.gen.cache.layers[0], SlotLayer) for j in batch])
        real(batch)

    engine._step_inference = spy
    short = [engine.submit(q, chat=True, max_new_tokens=3) for q in ("Name a colour.", "Say hi.")]
    long = engine.submit("Hi", chat=True, max_new_tokens=300, stop_on_eos=False)  # longer than a slot
    assert wait_all(short, 600)
    long.cancel.cancel()
    assert wait_all([long], 600)
    assert seen[0] == [True, True, False]
    assert engine.slots is not None and engine.slots._free == list(range(engine.max_batch))


def test_the_buffers_grow_to_what_the_runs_need_and_keep_what_they_hold():
    torch.manual_seed(1)
    store = SlotKV(LAYERS, slots=8, capacity=256)
    a = empty_cache()
    assert store.attach(a, 20)
    assert store.size == (1, 32)  # one slot of 20 tokens, rounded up
    k, v = kv(20)
    a.update(k, v, 0)
    assert store.keys[0] is not None and tuple(store.keys[0].shape) == (1, HKV, 32, D)
    b = empty_cache()
    assert store.attach(b, 100)  # a longer run in a second slot: every buffer grows, copying what it held
    assert store.size == (2, 128) and tuple(store.keys[0].shape) == (2, HKV, 128, D)
    assert torch.equal(a.layers[0].keys, k) and torch.equal(a.layers[0].values, v)
    assert a.layers[0].keys.untyped_storage().data_ptr() == store.keys[0].untyped_storage().data_ptr()
    more = kv(1)
    a.update(*more, 0)
    assert torch.equal(a.layers[0].keys, torch.cat([k, more[0]], dim=2))


def test_runs_arriving_together_grow_the_buffers_once_and_each_get_a_slot_of_its_own():
    torch.manual_seed(2)
    store = SlotKV(LAYERS, slots=8, capacity=256)
    first = empty_cache()
    assert store.attach(first, 20)
    k, v = kv(20)
    first.update(k, v, 0)  # the buffers exist: each growth from here on is a copy
    buffers = []
    fit = store._fit

    def watched(slots: int, tokens: int) -> None:
        fit(slots, tokens)
        if not buffers or buffers[-1] is not store.keys[0]:
            buffers.append(store.keys[0])

    store._fit = watched  # type: ignore[method-assign]
    used = empty_cache()
    used.update(*kv(2), 0)  # a cache with entries of its own takes no slot, and costs no room
    room = [empty_cache() for _ in range(5)]
    assert store.attach_all([(c, 40) for c in room[:2]] + [(used, 40)] + [(c, 90) for c in room[2:]]) == [
        True,
        True,
        False,
        True,
        True,
        True,
    ]
    assert len(buffers) == 1  # one copy for the five, not one per arrival
    assert store.size == (6, 96)
    assert sorted(c.layers[0].slot for c in room) == [1, 2, 3, 4, 5]
    assert torch.equal(first.layers[0].keys, k) and torch.equal(first.layers[0].values, v)
    crowd = [empty_cache() for _ in range(4)]  # more than the free slots: the first ones get them
    assert store.attach_all([(c, 10) for c in crowd]) == [True, True, False, False]
    assert store.size == (8, 96)


def test_a_full_slot_refuses_an_append_even_when_its_indices_were_made_for_another_layer():
    store = SlotKV(LAYERS, slots=1, capacity=32)
    cache = empty_cache()
    assert store.attach(cache, 4)  # 32 tokens: a slot is allocated in steps of ROUND
    for layer in range(LAYERS):
        cache.update(*kv(31), layer)
    k, v = torch.randn(1, HKV, 1, D), torch.randn(1, HKV, 1, D)
    for layer in range(LAYERS):  # the last free entry: layer 1 reuses the indices layer 0 made
        store.append(layer, [cache.layers[layer]], k, v, rows=[0])
    assert cache.get_seq_length() == 32 and torch.equal(cache.layers[1].keys[:, :, -1:], k)
    with pytest.raises(RuntimeError, match="is full"):
        store.append(0, [cache.layers[0]], k, v, rows=[0])
