"""``python app.py --dtype bfloat16`` serves every named endpoint, and ``/generate`` says the cache changed nothing."""

from __future__ import annotations

import pytest

from tests.server import start_app, stop_app

pytestmark = pytest.mark.slow  # starts the app in bf16


@pytest.fixture(scope="module")
def client16(tmp_path_factory):
    from gradio_client import Client

    folder = tmp_path_factory.mktemp("bf16")
    app = start_app(folder, {"KVVIZ_WARM": "0"}, args=["--dtype", "bfloat16"], timeout_s=600)
    try:
        yield Client(app.url, verbose=False)
    finally:
        stop_app(app.proc)


def test_every_endpoint_answers_in_bf16(client16):
    out = client16.predict("What is the capital of France?", 8, True, 0.0, 1.0, 0, api_name="/generate")
    assert out["model"]["dtype"] == "bfloat16" and out["model"]["bytes_per_element"] == 2
    verdict = out["equivalence"]
    assert verdict["cache_changes_nothing"] is True and verdict["dtype"] == "bfloat16"
    assert 1e-3 < out["max_abs_logit_diff_vs_recompute"] < verdict["tolerance"]
    chat = client16.predict("And of Italy?", 6, True, 0.0, 1.0, 0, "[]", "model", api_name="/chat")
    assert chat["equivalence"]["cache_changes_nothing"] is True
    prompt = "The KV cache stores the keys and values of every token the model has seen, so a step reads them all."
    evicted = client16.predict(prompt, "streaming_llm", 12, None, True, 4, {"sinks": 2}, api_name="/evict")
    per_token = 2 * 30 * 3 * 64 * 2  # SmolLM2's shape, 2 bytes an element in bf16
    assert evicted["policy"] == "streaming_llm" and evicted["cache_bytes"] == 12 * per_token
    assert client16.predict("loaded", 100, api_name="/memory")["bytes_per_token"] == per_token
