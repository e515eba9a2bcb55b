"""The ``/memory`` endpoint through gradio_client against the running app: the CLI's JSON contract."""

from __future__ import annotations

import json

import pytest
from gradio_client.exceptions import AppError

GiB = 2**30


def test_memory_endpoint_chapter_example(client):
    out = client.predict("Llama-3-70B", 8192, 162, "bf16", None, 8, 80, 0.1, 140, 3.35, None, api_name="/memory")
    assert out["bytes_per_token"] == 327_680 and out["bytes_per_sequence"] == int(2.5 * GiB)
    assert out["total_bytes"] == 162 * out["bytes_per_sequence"]
    assert out["kv_budget_bytes"] == 436 * 10**9 and out["max_sequences"] == 162
    assert round(out["decode_ms_weights"], 1) == 5.2 and round(out["decode_ms_kv"]) == 16
    assert len(out["layers"]) == 80 and out["layers"][0]["kind"] == "full"


def test_memory_endpoint_config_json_and_loaded_model(client):
    cfg = {
        "model_type": "mistral",
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "hidden_size": 4096,
        "sliding_window": 4096,
    }
    out = client.predict(json.dumps(cfg), 131_072, api_name="/memory")
    assert {layer["tokens_held"] for layer in out["layers"]} == {4095}
    loaded = client.predict("loaded", 100, api_name="/memory")
    assert loaded["bytes_per_token"] == 2 * 30 * 3 * 64 * 2  # bf16 by default, SmolLM2's shape
    assert "kv_budget_bytes" not in loaded


@pytest.mark.parametrize(
    "args, message",
    [
        (("/etc/passwd",), "config must be a preset"),
        (("Llama-3-70B", 8192, 1, "fp6"), "Unknown KV dtype"),
        (("Llama-3-70B", 8192, 1, "bf16", 3), "cannot split"),
        (("{not json",), "not valid JSON"),
    ],
)
def test_memory_endpoint_rejects_bad_input_with_a_message(client, args, message):
    with pytest.raises(AppError, match=message):
        client.predict(*args, api_name="/memory")
