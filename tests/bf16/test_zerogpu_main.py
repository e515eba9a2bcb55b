"""A ZeroGPU Space's main process as the real ``spaces`` package presents it: ``torch.cuda.is_available()`` is
True there (patched; CUDA itself may not be initialised), so the model is placed on CUDA in bf16 at start-up and
computed only inside GPU calls; the bf16 verdict and the stored results follow that dtype and device."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from kvviz.models import pick_device, pick_dtype
from kvviz.settings import Settings
from kvviz.ui.serving import precompute


@pytest.fixture
def zerogpu_main(monkeypatch):
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    # what spaces.zero.torch.patching.patch() does in the main process
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args, **kwargs: "NVIDIA H200 MIG 3g.71gb")


def test_the_main_process_places_the_model_on_cuda_in_bf16_and_computes_nothing_at_start_up(zerogpu_main):
    device = pick_device()
    assert device.type == "cuda" and pick_dtype(device) == torch.bfloat16
    s = Settings.from_env()
    assert s.zero_gpu and not s.precompute and not s.warm  # no forward outside a GPU call
    assert s.key_reads_per_s == 1e9 and s.gather_ms == 0


def test_its_stored_results_are_its_own(zerogpu_main, monkeypatch, tmp_path):
    monkeypatch.setattr(precompute, "code_version", lambda: "v1")
    lm = SimpleNamespace(name="SmolLM2", dtype=pick_dtype(pick_device()), device=pick_device())
    ctx = SimpleNamespace(settings=Settings(results_dir=str(tmp_path)), lm=lm)
    files = precompute.disk(ctx)
    assert files is not None and files.runs_as == "bfloat16 on cuda"
