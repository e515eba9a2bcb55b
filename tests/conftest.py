"""Shared fixtures: the real bundled model, loaded once per test session."""

from __future__ import annotations

import pytest

from kvviz.models import load_model


@pytest.fixture(scope="session")
def lm():
    """The bundled SmolLM2-135M-Instruct (fp32, CPU): the model every real-model test uses."""
    return load_model()


# the running app for tests/api and tests/browser, started once per session
from tests.server import app_server, app_server_process, inprocess_app  # noqa: E402, F401
