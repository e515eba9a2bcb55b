"""Eight students at once: each gets exactly the answer a solo run of their own prompt gives.

The model is shared read-only; if any state leaked between concurrent jobs (the cache, the
recorder, the attention function) an answer would differ from its solo run.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from gradio_client import Client

PROMPTS = [
    f"{start}"
    for start in (
        "The capital of France is",
        "My favourite fruit is the",
        "Water boils at a temperature of",
        "The largest planet in our solar system is",
        "In 1492, Columbus",
        "A triangle has three",
        "The chemical symbol for gold is",
        "Monday comes before",
    )
]
NEW_TOKENS = 3


def _ask(url: str, prompt: str) -> dict:
    # one client = one session, like one student's browser; a busy 2-core server may take > 5 s to accept
    client = Client(url, verbose=False, httpx_kwargs={"timeout": 120})
    return client.predict(prompt, NEW_TOKENS, False, 0.0, 1.0, 0, api_name="/generate")


def test_eight_sessions_each_get_their_solo_answer(app_server, app_server_process):
    solo = [_ask(app_server, p) for p in PROMPTS]
    assert len({s["text"] for s in solo}) >= 6, "prompts too alike to detect cross-talk"
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(lambda p: _ask(app_server, p), PROMPTS))
    for prompt, a, b in zip(PROMPTS, solo, together):
        assert (b["text"], b["generated_tokens"], b["cache_bytes"]) == (
            a["text"],
            a["generated_tokens"],
            a["cache_bytes"],
        ), prompt
        assert b["max_abs_logit_diff_vs_recompute"] < 1e-3
    assert app_server_process.alive()
