"""Playwright in a system Chromium: ``browser_context``, ``page``, ``screenshot``; ``examples_server``: a server
that computed every show-me example at start-up into a results folder (shared by the tests of stored examples).

The browser comes from ``$KVVIZ_CHROMIUM`` (``make test`` sets it from ``tools/browser.sh``, which finds
or installs one) or ``/usr/bin/chromium``. If it is missing the tests fail with a message saying how to
get one; they never skip.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHOTS = Path(os.environ.get("KVVIZ_SCREENSHOTS", ROOT / "tmp" / "screenshots"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_path() -> str:
    """The Chromium to drive, or a test failure that says how to get one."""
    wanted = os.environ.get("KVVIZ_CHROMIUM") or "/usr/bin/chromium"
    found = wanted if os.path.isfile(wanted) and os.access(wanted, os.X_OK) else shutil.which(wanted)
    if not found:
        pytest.fail(
            f"Chromium not found at {wanted!r}: run `tools/browser.sh` (make test does), install it with "
            "`sudo apt-get install -y chromium`, or point KVVIZ_CHROMIUM at a Chromium binary.",
            pytrace=False,
        )
    return found


@pytest.fixture(scope="session")
def browser_context(tmp_path_factory):
    """One headless Chromium with a fresh profile for the whole session (each test gets its own page)."""
    from playwright.sync_api import sync_playwright

    executable = chromium_path()
    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as pw:
        # Playwright passes the profile as --user-data-dir itself (it refuses the flag in args)
        context = pw.chromium.launch_persistent_context(
            str(profile),
            executable_path=executable,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 1000},
        )
        try:
            yield context
        finally:
            context.close()


@pytest.fixture
def page(browser_context, app_server):
    """A new tab on the running app, fully loaded; closed after the test."""
    tab = browser_context.new_page()
    tab.set_default_timeout(30_000)
    tab.goto(app_server, wait_until="load")
    tab.wait_for_selector("#generate-btn")
    yield tab
    tab.close()


@pytest.fixture
def screenshot(request):
    """``screenshot(page, name)`` saves a full-page PNG under tmp/screenshots (KVVIZ_SCREENSHOTS) and returns its path."""
    SHOTS.mkdir(parents=True, exist_ok=True)

    def save(tab, name: str | None = None) -> Path:
        path = SHOTS / f"{name or request.node.name}.png"
        tab.screenshot(path=str(path), full_page=True)
        return path

    return save


def pytest_collection_modifyitems(items):
    """Every test in this folder carries the ``browser`` marker (so ``-m 'not browser'`` can leave them out)."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.browser)


@dataclass
class ExamplesServer:
    """A running server whose start-up computed every show-me example, and the results folder it stored them in."""

    url: str
    results: Path


@pytest.fixture(scope="session")
def examples_server(browser_context, tmp_path_factory):
    """A server started with ``KVVIZ_PRECOMPUTE=1`` on a results folder of its own, returned once its Learn tab says
    every example is ready. Computing the examples takes minutes on two cores, so it happens once: the show-me walk
    clicks through this server, and the servers of the stored-example tests (a restart, the first minute) start on
    its folder as a later start of the same code would."""
    from tests.browser.showme import READY_TIMEOUT_MS
    from tests.server import start_app, stop_app

    base = tmp_path_factory.mktemp("examples")
    results = base / "results"
    running = start_app(base / "server", {"KVVIZ_PRECOMPUTE": "1", "KVVIZ_RESULTS_DIR": str(results)}, timeout_s=600)
    try:
        tab = browser_context.new_page()
        tab.goto(running.url + "?tab=learn", wait_until="load")
        tab.locator("#learn-ready").get_by_text("all", exact=False).wait_for(timeout=READY_TIMEOUT_MS)
        tab.close()
        assert list(results.rglob("*.json")), "the server stored no results"
        yield ExamplesServer(running.url, results)
    finally:
        stop_app(running.proc)
