"""``client``: a gradio_client Client on the shared running app (``app_server`` from tests/server.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def client(app_server):
    """One API client for the session (each ``predict`` call is its own job)."""
    from gradio_client import Client

    return Client(app_server, verbose=False)
