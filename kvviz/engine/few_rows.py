"""Linear layers over a few rows, as the engine's batched decode steps feed them.

A packed decode step multiplies every weight matrix by one row per running sequence — a dozen to a
few dozen when a room decodes together. For fp32 on the CPU, ``F.linear`` hands MKL x·Wᵀ with the stored
[out, in] weight read transposed, a case MKL threads poorly at those sizes: on the 2-core machine
the same product computed as (W·xᵀ)ᵀ, which reads the weight in its stored order, took a half to a
third of the time (SmolLM2's linears at 12–48 rows; ``bench/few_rows.py``), while from about 60 rows
on ``F.linear`` is faster, and at a few rows they are alike. :func:`prepare` gives a model's plain
``nn.Linear`` layers that second route, and :func:`few_rows` turns it on for the calling thread
only: every other thread sharing the model computes exactly as before. The two routes differ only
in the order of the sums (a few 1e-6 in this model's products). (A lone run's decode step
once ran on one intra-op thread; ``bench/page_speed.py`` measured the page faster with both: 0.68× the
library against 0.57×, so that rule is gone.)
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from kvviz.models import LoadedModel

ROWS = range(12, 57)  # row counts where W·xᵀ beat x·Wᵀ over one forward's linears (bench/few_rows.py)
_state = threading.local()


class FewRowsLinear(torch.nn.Linear):
    """An ``nn.Linear`` that, inside :func:`few_rows` and for :data:`ROWS` rows, computes (W·xᵀ)ᵀ."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if getattr(_state, "on", False) and x.shape[-1] > 0:
            rows = x.numel() // x.shape[-1]
            if rows in ROWS:
                return transposed_product(x.reshape(rows, -1), self.weight, self.bias).reshape(
                    *x.shape[:-1], self.out_features
                )
        return super().forward(x)


def transposed_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x·Wᵀ (+ b) for 2-D ``x``, computed as (W·xᵀ)ᵀ."""
    y = torch.mm(weight, x.t()).t()
    return y if bias is None else y + bias


def prepare(lm: LoadedModel) -> bool:
    """Give ``lm``'s plain linear layers the few-rows route; True when it applies: an fp32 model on the
    CPU that accelerate has not dispatched (its hooks keep each module's own forward)."""
    if lm.device.type != "cpu" or lm.dtype != torch.float32 or lm.device_map:
        return False
    for module in lm.model.modules():
        if type(module) is torch.nn.Linear:
            module.__class__ = FewRowsLinear
    return True


@contextmanager
def few_rows() -> Iterator[None]:
    """Within the block, this thread's forwards through prepared layers take the few-rows route."""
    previous = getattr(_state, "on", False)
    _state.on = True
    try:
        yield
    finally:
        _state.on = previous
