"""app.py's shutdown: SIGTERM mid-generation (a Space restarting) ends the run, removes the session folders
and exits 0 at once — not ``terminate called without an active exception`` (an abort, exit code -6)."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from gradio_client import Client

from tests.server import start_app, stop_app

pytestmark = pytest.mark.slow  # starts its own app
EXIT_WITHIN_S = 10.0


def test_sigterm_mid_generation_exits_0_at_once_and_leaves_no_session_files(tmp_path):
    app = start_app(tmp_path)
    try:
        root = Path(re.search(r"session files under (\S+)", app.log()).group(1))
        assert root.is_dir() and root.parent == app.temp_dir
        client = Client(app.url, verbose=False)
        job = client.submit("Tell me a long story about a cat.", 64, api_name="/generate")
        deadline = time.monotonic() + 60
        while client.predict(api_name="/engine")["running"] == 0:  # the run is decoding in the engine's thread
            assert time.monotonic() < deadline and not job.done(), "the generation never started"
            time.sleep(0.05)
        app.proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        try:
            code = app.proc.wait(timeout=EXIT_WITHIN_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"app.py still running {EXIT_WITHIN_S:.0f} s after SIGTERM:\n{app.log()[-3000:]}")
        took = time.monotonic() - t0
    finally:
        stop_app(app.proc)
    log = app.log()
    assert code == 0, f"exit code {code} after SIGTERM:\n{log[-3000:]}"
    assert "terminate called" not in log
    assert not root.exists(), "the session folders outlived the server"
    assert not [p.name for p in app.temp_dir.iterdir() if p.name.startswith("kvviz-")]
    assert took < EXIT_WITHIN_S
