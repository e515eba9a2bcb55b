"""The running app for end-to-end tests: ``app_server`` starts ``python app.py`` once per test session.

Imported by ``tests/conftest.py`` so ``tests/api`` and ``tests/browser`` share one server (start-up and
model load cost ~10 s; doing it once keeps the suite fast). The server gets its own temporary folder
(``GRADIO_TEMP_DIR``, ``TMPDIR``) so tests can check that nothing is written elsewhere and that it is
cleaned up.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 120.0
# limits the end-to-end tests rely on (small, so fault and limit cases are cheap to reach)
SERVER_ENV = {
    "KVVIZ_MAX_NEW_TOKENS": "64",
    "KVVIZ_MAX_PROMPT_TOKENS": "1024",
    "KVVIZ_CONCURRENCY": "1",
    "KVVIZ_QUEUE_SIZE": "64",
    # the shared server computes each example on its first click (tests/browser/test_showme_walk.py starts
    # one that computes them all at start-up)
    "KVVIZ_PRECOMPUTE": "0",
    # nor reads or writes stored show-me results (a test that wants them passes its own folder)
    "KVVIZ_RESULTS_DIR": "0",
}


@dataclass
class RunningApp:
    """One ``python app.py`` subprocess: its base URL, process, private temp folder and log file."""

    url: str
    proc: subprocess.Popen
    temp_dir: Path
    log_path: Path

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def rss(self) -> int:
        """The server's resident memory in bytes."""
        import psutil

        return psutil.Process(self.proc.pid).memory_info().rss


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http_ok(url: str, proc: subprocess.Popen, log_path: Path, timeout_s: float = START_TIMEOUT_S) -> None:
    """Poll ``url`` until it answers 200; fail with the server log if the process dies or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"app.py exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"app.py did not answer 200 within {timeout_s:.0f} s:\n{log_path.read_text()[-4000:]}")


def start_app(
    base: Path,
    extra_env: dict[str, str] | None = None,
    args: list[str] | None = None,
    timeout_s: float = START_TIMEOUT_S,
) -> RunningApp:
    """Start ``app.py`` on a free port with a private temp folder under ``base``; wait until it serves."""
    port = free_port()
    temp_dir = base / "tmp"
    temp_dir.mkdir(parents=True, exist_ok=True)
    log_path = base / "app.log"
    env = {
        **os.environ,
        **SERVER_ENV,
        "GRADIO_TEMP_DIR": str(temp_dir),
        "TMPDIR": str(temp_dir),
        "GRADIO_ANALYTICS_ENABLED": "False",
        "PYTHONUNBUFFERED": "1",
        **(extra_env or {}),
    }
    for name in ("SPACE_ID", "KVVIZ_PUBLIC", "KVVIZ_PORT", "KVVIZ_HOST", "KVVIZ_ROOT_PATH"):
        if name not in (extra_env or {}):
            env.pop(name, None)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "app.py", "--host", "127.0.0.1", "--port", str(port), *(args or [])],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_http_ok(url, proc, log_path, timeout_s)
    except BaseException:
        stop_app(proc)
        raise
    return RunningApp(url=url, proc=proc, temp_dir=temp_dir, log_path=log_path)


def stop_app(proc: subprocess.Popen) -> None:
    """Terminate, then kill if it will not go."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)


@pytest.fixture(scope="session")
def app_server_process(tmp_path_factory) -> RunningApp:
    """The shared running app (details: URL, process, temp folder, log)."""
    running = start_app(tmp_path_factory.mktemp("app-server"))
    yield running
    stop_app(running.proc)


@pytest.fixture(scope="session")
def app_server(app_server_process: RunningApp) -> str:
    """Base URL of the shared running app, e.g. ``http://127.0.0.1:43121/``."""
    return app_server_process.url


@dataclass
class InProcessApp:
    """The app served from the test process, so tests can look inside: its context, Blocks and model."""

    url: str
    ctx: object  # kvviz.ui.serving.context.AppContext
    demo: object  # gradio.Blocks


@pytest.fixture(scope="session")
def inprocess_app(lm, tmp_path_factory) -> InProcessApp:
    """``build_app`` on the shared ``lm``, launched in this process (heartbeat 1 s so page closes are seen fast)."""
    from kvviz.safety import SessionFiles
    from kvviz.settings import Settings
    from kvviz.ui.app import build_app, serve
    from kvviz.ui.serving import sessions
    from kvviz.ui.serving.context import AppContext

    old = os.environ.get("GRADIO_HEARTBEAT_INTERVAL")
    os.environ["GRADIO_HEARTBEAT_INTERVAL"] = "1"
    settings = Settings(max_new_tokens=256, max_prompt_tokens=1024, concurrency=1, session_grace_s=0)
    ctx = AppContext(lm=lm, settings=settings, files=SessionFiles(tmp_path_factory.mktemp("inproc-files")))
    demo = build_app(ctx)
    sessions.install(demo, ctx)
    options = serve(demo, settings)
    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, **options)
    try:
        yield InProcessApp(url=f"http://127.0.0.1:{port}/", ctx=ctx, demo=demo)
    finally:
        demo.close()
        ctx.files.cleanup()
        if old is None:
            os.environ.pop("GRADIO_HEARTBEAT_INTERVAL", None)
        else:
            os.environ["GRADIO_HEARTBEAT_INTERVAL"] = old
