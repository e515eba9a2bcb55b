"""What kvviz reads of a loaded model: its shape and measured facts, once per model, dtype and device."""

from __future__ import annotations

import dataclasses

import torch

from kvviz.capture.model_io import model_info


def test_model_info_walks_the_model_once_per_model_dtype_and_device(lm, monkeypatch):
    first = model_info(lm)
    walked = []  # every walk over a model's parameters
    real = torch.nn.Module.parameters
    monkeypatch.setattr(torch.nn.Module, "parameters", lambda self, *a, **k: walked.append(self) or real(self, *a, **k))
    again = model_info(lm)
    assert again == first and again is not first and not walked  # a fresh ModelInfo, nothing walked again
    assert first.param_count == sum(p.numel() for p in real(lm.model)) and first.weight_bytes == 4 * first.param_count
    other = model_info(dataclasses.replace(lm, dtype=torch.bfloat16))  # another dtype: measured afresh
    assert walked and other.dtype == "bfloat16"
