"""Query statistics for ExpectedAttention are gathered from the collecting thread's prefill only."""

from __future__ import annotations

import threading

import torch
from transformers import DynamicCache

from kvviz.capture.model_io import forward
from kvviz.eviction.query_stats import collecting


def _stats(lm, ids: list[int]):
    with torch.inference_mode(), collecting(lm.model, 2, [len(ids)]) as get:
        forward(lm, ids, 0, DynamicCache(config=lm.config), None)
        return get(len(ids))


def test_another_threads_forwards_on_the_shared_model_are_not_collected(lm):
    ids = lm.tokenizer("The cache holds every key and value the model has written so far.")["input_ids"]
    alone = _stats(lm, ids)
    stop = threading.Event()

    def other_user() -> None:  # another session's run on the same model, at the same time
        other = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12]])
        with torch.inference_mode():
            while not stop.is_set():
                lm.model(input_ids=other)

    thread = threading.Thread(target=other_user)
    thread.start()
    try:
        for _ in range(5):
            busy = _stats(lm, ids)
            torch.testing.assert_close(busy.mean, alone.mean, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(busy.cov, alone.cov, atol=1e-5, rtol=1e-5)
    finally:
        stop.set()
        thread.join()
