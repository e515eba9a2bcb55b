"""The bundled model in bf16 (the dtype of every GPU and of a ZeroGPU Space's main process), on the CPU."""

from __future__ import annotations

import pytest

from kvviz.models import load_model


@pytest.fixture(scope="session")
def lm16():
    """SmolLM2-135M-Instruct in bfloat16 on the CPU, loaded once per test session."""
    return load_model(dtype="bfloat16")
