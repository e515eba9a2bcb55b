"""The page's HTML runs the status-timer script before any of Gradio's own, and nothing else the server sends changes."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import gradio as gr
import httpx
import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient

from kvviz.ui.page.status_timer import STATUS_TIMER_JS, FirstScript

TAG = f"<script>{STATUS_TIMER_JS}</script>"


@pytest.fixture(scope="module")
def gradio_url():
    """A small Gradio app launched with the middleware, as ``serve`` adds it."""
    with gr.Blocks() as demo:
        gr.Textbox(label="x")
    demo.launch(prevent_thread_lock=True, quiet=True, app_kwargs={"middleware": [Middleware(FirstScript)]})
    try:
        yield demo.local_url
    finally:
        demo.close()


def test_gradios_page_runs_the_script_before_its_own_scripts(gradio_url):
    r = httpx.get(gradio_url, timeout=30)
    assert r.status_code == 200 and r.text.count(TAG) == 1
    head = r.text.split("<head>", 1)[1]
    assert head.startswith(TAG)  # first in <head>: before the config, before the module that loads the tracker
    assert head.index(TAG) < head.index('<script type="module"')
    assert int(r.headers["content-length"]) == len(r.content)


def test_every_other_answer_passes_untouched(gradio_url):
    config = httpx.get(gradio_url + "config", timeout=30)
    assert config.status_code == 200 and "kvvizStatusTimer" not in config.text
    head = httpx.head(gradio_url, timeout=30)
    assert head.status_code == 200
    assert int(head.headers["content-length"]) == len(httpx.get(gradio_url, timeout=30).content)  # the same page


def test_an_html_answer_elsewhere_or_compressed_is_left_as_sent():
    page = "<html><head><title>t</title></head><body></body></html>"

    async def packed(_request):
        return Response(gzip.compress(page.encode()), media_type="text/html", headers={"content-encoding": "gzip"})

    async def other(_request):
        return HTMLResponse(page)

    app = Starlette(routes=[Route("/", packed), Route("/other", other)], middleware=[Middleware(FirstScript)])
    client = TestClient(app)
    assert client.get("/").text == page  # decoded by the client: the gzip body was sent as it was
    assert client.get("/other").text == page


def test_the_installed_gradio_has_the_tracker_file_the_script_looks_for():
    """A Gradio upgrade that renames the tracker's file (the script would quietly wrap nothing) fails here."""
    assets = Path(gr.__file__).parent / "templates" / "frontend" / "assets"
    found = sorted(assets.glob("statustracker-*.js"))
    assert len(found) == 1
    pattern = re.search(r"const tracker = /(.+)/;", STATUS_TIMER_JS).group(1).replace("\\\\", "\\")
    assert re.search(pattern, f"http://host/assets/{found[0].name}:1:7296")
    assert "requestAnimationFrame" in found[0].read_text()
