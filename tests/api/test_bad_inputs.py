"""The bad-input corpus through the running app: every case gets a clear message and the app stays up.

Cases are collected only for endpoints the app defines; ``test_required_endpoints_exist`` fails
until all of generate, memory and evict are there, so no case is silently left out.
"""

from __future__ import annotations

import re

import pytest
from gradio_client.exceptions import AppError

from tests.api.bad_inputs import CASES, REQUIRED_ENDPOINTS, call_raw, endpoints_in_source, resolve

PRESENT = endpoints_in_source()
ACTIVE = [c for c in CASES if c.endpoint in PRESENT]


@pytest.fixture(scope="module")
def api(client):
    """The app's named endpoints and their parameters, as gradio_client reports them."""
    return client.view_api(return_format="dict", print_info=False)["named_endpoints"]


def test_corpus_is_big_enough():
    assert len(CASES) >= 30
    assert len([c for c in CASES if c.endpoint == "generate"]) >= 30


def test_required_endpoints_exist(api):
    missing = [name for name in REQUIRED_ENDPOINTS if f"/{name}" not in api]
    assert not missing, f"endpoints missing from the app's API: {missing} (their bad-input cases cannot run yet)"


def test_source_scan_matches_the_running_app(api):
    # the corpus is collected from a scan of kvviz/ui; the running app must agree with it
    assert {f"/{n}" for n in PRESENT if n in REQUIRED_ENDPOINTS} == {
        e for e in api if e.strip("/") in REQUIRED_ENDPOINTS
    }


@pytest.mark.parametrize("case", ACTIVE, ids=[c.id for c in ACTIVE])
def test_bad_input_gets_a_clear_answer(case, client, api, app_server, app_server_process):
    values = resolve(case, api[f"/{case.endpoint}"]["parameters"])
    if case.raw:
        event, data = call_raw(app_server, case.endpoint, values)
        message = (data or {}).get("error") if event == "error" else None
        result = data[0] if event == "complete" else None
    else:
        try:
            result, message = client.predict(*values, api_name=f"/{case.endpoint}"), None
        except AppError as exc:
            result, message = None, str(exc)
    if case.ok:
        assert message is None, f"valid odd input was refused: {message}"
        assert isinstance(result, dict) and result.get("generated_tokens", 1) >= 1
    else:
        assert message, f"no clear error for {case.id}: got result {str(result)[:200]}"
        assert re.search(case.error, message, re.IGNORECASE), f"unclear message for {case.id}: {message!r}"
        assert "Traceback" not in message and len(message) < 600
    assert app_server_process.alive(), "the app died"


def test_app_still_answers_after_the_corpus(client):
    out = client.predict("The capital of France is", 2, False, 0.0, 1.0, 0, api_name="/generate")
    assert "Paris" in out["text"]
