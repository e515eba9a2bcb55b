"""KVzip's repeat-pass scores, computed a block of repeat queries at a time, are those of the whole
[KV head, group, queries, keys] softmax at once (the matrix kvpress builds), on the bundled model."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from kvviz.capture.attention_fn import installed
from kvviz.capture.model_io import forward
from kvviz.eviction import reconstruction
from kvviz.eviction.reconstruction import reconstruction_scores, repeat_chunks

PROMPT = (
    "The lighthouse keeper wrote the ship's name in the log: Aurora. Storms came in October and the lamp was "
    "cleaned every morning before sunrise. Visitors asked about the old fog horn, which had been silent for years."
)


def _prefill(lm, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    cache = DynamicCache(config=lm.config)
    with torch.inference_mode(), installed(lm.model):
        forward(lm, ids, 0, cache, None)
    return torch.stack([la.keys[0] for la in cache.layers]), torch.stack([la.values[0] for la in cache.layers])


def test_blocks_of_repeat_queries_give_the_whole_softmax_scores(lm, monkeypatch):
    text = lm.tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPT}], add_generation_prompt=True, tokenize=False
    )
    ids = [int(i) for i in lm.tokenizer.encode(text, add_special_tokens=False)]
    keys, values = _prefill(lm, ids)
    for chunk_size in (2048, 24):  # one repeat pass, then several (each with its own sinks and chunk)
        header, chunks = repeat_chunks(lm.tokenizer, ids, chunk_size)
        q_len = max(len(c.ids) for c in chunks)
        monkeypatch.setattr(reconstruction, "ROWS", 10 * q_len)  # one block: every query's row at once
        whole = reconstruction_scores(lm, keys, values, ids, 4, chunk_size).scores
        monkeypatch.setattr(reconstruction, "ROWS", 7)  # blocks that end inside the causal part, a short last one
        blocks = reconstruction_scores(lm, keys, values, ids, 4, chunk_size).scores
        assert q_len > 3 * 7 and (len(chunks) == 1 if chunk_size == 2048 else len(chunks) > 2)
        assert torch.allclose(blocks, whole, rtol=0, atol=1e-6), (chunk_size, float((blocks - whole).abs().max()))
        assert bool((whole[..., :header] == 0).all()) and bool((whole[..., header:] > 0).all())
