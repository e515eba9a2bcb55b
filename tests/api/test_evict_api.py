"""The ``/evict`` endpoint through gradio_client against the running app: the CLI's JSON contract."""

from __future__ import annotations

import pytest
from gradio_client.exceptions import AppError

PROMPT = "Write one sentence about the sea."


def test_evict_endpoint_returns_the_cli_json(client):
    out = client.predict(PROMPT, "streaming_llm", 12, None, True, 4, 2, api_name="/evict")
    n = out["prompt_tokens"]
    assert out["policy"] == "streaming_llm" and out["n_kept"] == 12 and out["params"]["sinks"] == 2
    assert all(head == [0, 1, *range(n - 10, n)] for layer in out["kept"] for head in layer)
    per_token = 2 * 30 * 3 * 64 * 4
    assert out["cache_bytes"] == 12 * per_token
    assert out["full_cache_bytes"] == (n + out["generated_tokens"] - 1) * per_token
    assert isinstance(out["text"], str)


def test_evict_endpoint_by_ratio_with_snapkv(client):
    out = client.predict(
        "The meeting moved to Thursday at noon in room B. " * 6,
        "snapkv",
        None,
        0.5,
        False,
        2,
        None,
        8,
        3,
        "avg",
        api_name="/evict",
    )
    n = out["prompt_tokens"]
    assert out["n_kept"] == max(1, int(n * 0.5))
    assert all(head[-8:] == list(range(n - 8, n)) for layer in out["kept"] for head in layer)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((PROMPT, "streaming_llm", 12, 0.5), "exactly one"),
        ((PROMPT, "lru", 12, None), "Pick a policy"),
        ((PROMPT, "streaming_llm", 12, None, True, 4, None, 8), "does not apply"),
        (("   ", "full", 12, None), "empty"),
    ],
)
def test_evict_endpoint_refuses_bad_input_with_a_message(client, args, message):
    with pytest.raises(AppError, match=message):
        client.predict(*args, api_name="/evict")
