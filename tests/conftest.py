"""Shared fixtures: the real bundled model, loaded once per test session, and the running app for tests/api
and tests/browser (tests/server.py, started once per session); tests that need a running app are ``slow``."""

from __future__ import annotations

import os

import pytest

from kvviz.models import load_model
from tests.server import app_server, app_server_process, inprocess_app  # noqa: F401  (fixtures)

# tests never read or write the user's stored show-me results (a test that wants them passes its own folder)
os.environ.setdefault("KVVIZ_RESULTS_DIR", "0")
SERVED = {"app_server", "app_server_process", "inprocess_app", "client"}


@pytest.fixture(scope="session")
def lm():
    """The bundled SmolLM2-135M-Instruct (fp32, CPU): the model every real-model test uses."""
    return load_model()


def pytest_collection_modifyitems(items):
    """Tests that start the app (as a subprocess server or in this process) are ``slow``."""
    for item in items:
        if SERVED & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
