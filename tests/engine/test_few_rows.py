"""The few-rows route: taken only inside ``few_rows`` in its own thread, for :data:`ROWS` rows, and the engine's
batched decode steps take it with results equal to solo runs."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F

from kvviz.capture.architectures import build
from kvviz.engine import few_rows as fr
from kvviz.engine.engine import Engine
from kvviz.engine.handle import wait_all
from tests.engine.test_engine import assert_same_run, keep_logits, solo  # noqa: F401  (keep_logits: autouse)
from tests.tiny_models import tiny_config, tiny_model


def layer(bias: bool = True) -> fr.FewRowsLinear:
    torch.manual_seed(0)
    lin = torch.nn.Linear(576, 1536, bias=bias)
    lin.__class__ = fr.FewRowsLinear
    return lin


@pytest.mark.parametrize("bias", [True, False])
def test_the_route_is_taken_inside_the_block_for_16_to_63_rows_only(bias):
    lin = layer(bias)
    for rows in (1, 8, 11, 12, 24, 56, 57, 64, 200):
        x = torch.randn(1, rows, 576)
        plain = F.linear(x, lin.weight, lin.bias)
        assert torch.equal(lin(x), plain), rows  # outside the block: F.linear itself
        with fr.few_rows():
            inside = lin(x)
        if rows in fr.ROWS:
            assert torch.equal(inside, fr.transposed_product(x[0], lin.weight, lin.bias)[None])
            torch.testing.assert_close(inside, plain, rtol=0, atol=1e-5)
        else:
            assert torch.equal(inside, plain), rows
    assert not getattr(fr._state, "on", False)  # the block restored the thread's state


def test_another_thread_sharing_the_layer_is_not_affected():
    lin, x = layer(), torch.randn(24, 576)
    seen: list[bool] = []
    inside, done = threading.Event(), threading.Event()

    def other() -> None:
        inside.wait(10)
        seen.append(torch.equal(lin(x), F.linear(x, lin.weight, lin.bias)))
        done.set()

    t = threading.Thread(target=other)
    t.start()
    with fr.few_rows():
        inside.set()
        done.wait(10)
    t.join()
    assert seen == [True]


def test_prepare_swaps_plain_linears_and_changes_nothing_outside_the_block():
    lm = tiny_model("llama")
    ids = torch.arange(3, 27)[None]
    before = lm.model(input_ids=ids).logits
    assert fr.prepare(lm)
    linears = [m for m in lm.model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(type(m) is fr.FewRowsLinear for m in linears)
    assert torch.equal(lm.model(input_ids=ids).logits, before)
    with fr.few_rows():
        torch.testing.assert_close(lm.model(input_ids=ids).logits, before, rtol=0, atol=1e-5)


def test_prepare_leaves_other_dtypes_alone():
    lm = build({**tiny_config("llama"), "torch_dtype": "bfloat16"}, name="tiny-bf16")
    lm.model.to(torch.bfloat16)
    lm.dtype = torch.bfloat16
    assert not fr.prepare(lm)
    assert not any(type(m) is fr.FewRowsLinear for m in lm.model.modules())


@pytest.mark.slow
def test_a_room_sized_batch_takes_the_route_and_equals_its_solo_runs(lm, monkeypatch):
    taken = []
    real = fr.transposed_product

    def spy(x, weight, bias):
        taken.append(x.shape[0])
        return real(x, weight, bias)

    monkeypatch.setattr(fr, "transposed_product", spy)
    prompts = [f"Count to {n}:" for n in range(2, 20)]  # 18 runs decode together
    engine = Engine(lm, prefix_cache_bytes=0)
    handles = [engine.submit(p, chat=False, max_new_tokens=3, verify=True) for p in prompts]
    assert wait_all(handles, 900)
    assert taken and set(taken) <= set(fr.ROWS)
    assert engine.counters["max_batch_seen"] == len(prompts)
    for h, p in zip(handles, prompts):
        assert_same_run(h.run.gen, solo(lm, p, chat=False, max_new_tokens=3))
        assert h.trace.equivalence["max_abs_logit_diff"] < 1e-3
