"""The ``/generate`` endpoint through gradio_client against the running app.

Greedy answers equal solo runs under concurrency in test_concurrency.py; bad input in test_bad_inputs.py.
"""

from __future__ import annotations

import pytest
from gradio_client.exceptions import AppError


def test_generate_returns_the_trace_summary(client):
    out = client.predict("What is the capital of France?", 8, True, 0.0, 1.0, 0, api_name="/generate")
    assert "Paris" in out["text"]
    model = out["model"]
    assert (model["layers"], model["q_heads"], model["kv_heads"], model["head_dim"]) == (30, 9, 3, 64)
    # bytes per token by the formula: 2 (K and V) x layers x kv_heads x head_dim x bytes/element
    per_token = 2 * model["layers"] * model["kv_heads"] * model["head_dim"] * model["bytes_per_element"]
    assert out["kv_bytes_per_token"] == per_token
    assert 1 <= out["generated_tokens"] <= 8
    # the cache holds every token but the last generated one (it was never fed back)
    assert out["cache_bytes"] == per_token * (out["prompt_tokens"] + out["generated_tokens"] - 1)
    assert out["max_abs_logit_diff_vs_recompute"] < 1e-3


def test_generate_rejects_an_empty_prompt_with_a_message(client):
    with pytest.raises(AppError, match="prompt is empty"):
        client.predict("   ", 8, True, 0.0, 1.0, 0, api_name="/generate")


def test_a_chat_turn_through_chat_reuses_the_previous_turn(client):
    import json

    question = "What is the capital of France?"
    one = client.predict(question, 8, True, 0.0, 1.0, 0, "[]", "model", api_name="/chat")
    assert one["turn"]["turn"] == 1 and one["turn_cached_tokens"] > one["prompt_tokens"]
    history = json.dumps([{"role": "user", "content": question}, {"role": "assistant", "content": one["text"]}])
    two = client.predict("And of Italy?", 8, True, 0.0, 1.0, 0, history, "model", api_name="/chat")
    assert two["turn"]["reused"] == two["cached_prompt_tokens"] == one["turn_cached_tokens"]
    assert two["turn"]["diverged"] is None and two["turn"]["computed"] == two["prompt_tokens"] - two["turn"]["reused"]
    dropped = client.predict("And of Spain?", 8, True, 0.0, 1.0, 0, history, "drop-answers", api_name="/chat")
    assert dropped["turn"]["diverged"] < one["prompt_tokens"]  # at the answer's message it left out
    assert dropped["turn"]["answered"] and dropped["text"].strip()  # and the new question is still answered
    assert dropped["turn"]["reused"] < one["turn_cached_tokens"]
