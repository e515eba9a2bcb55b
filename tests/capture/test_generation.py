"""The generation loop's plan for runs that prefill only part of the prompt, and its per-step options.

A prompt whose tail is fed one token per forward after a shorter prefill (how an eviction run compresses
the context and then reads the question) produces what a whole-prompt prefill produces; the step hook
hears every forward after the prefill; the recorder can be kept to the prefill; a cache that re-positions
keys is fed its slot positions.
"""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import torch
from transformers import DynamicCache

from kvviz.capture.attention_fn import installed
from kvviz.capture.drive import drive as solo
from kvviz.capture.drive import forwards
from kvviz.capture.generation import Generation
from kvviz.capture.model_io import encode_prompt, forward
from kvviz.capture.options import CacheSetup, Decode, Feed, Recording
from kvviz.eviction.policies import make_policy
from kvviz.eviction.run import Evictor

PROMPT = "Name the largest planet of the solar system."


def drive(lm, g: Generation) -> list[int]:
    """Run ``g`` alone to its end (the solo driver); the start position of every forward."""
    return [f.start for f in forwards(lm, g)]


def test_a_prompt_tail_fed_after_the_prefill_produces_the_whole_prompt_run(lm):
    ids = encode_prompt(lm, PROMPT, True)
    whole = Generation(
        lm,
        "",
        feed=Feed(prompt_ids=ids),
        decode=Decode(max_new_tokens=5),
        recording=Recording(on=False, keep_logprobs=True),
    )
    drive(lm, whole)
    hooks: list[tuple[int, int]] = []
    tail = Generation(
        lm,
        "",
        feed=Feed(prompt_ids=ids, prefill_tokens=len(ids) - 3),
        decode=Decode(max_new_tokens=5),
        recording=Recording(on=False, keep_logprobs=True),
        cache=CacheSetup(after_step=lambda cache, rec, step: hooks.append((step, cache.get_seq_length()))),
    )
    starts = drive(lm, tail)
    assert tail.trace.token_ids == whole.trace.token_ids and tail.trace.stop_reason == whole.trace.stop_reason
    assert torch.allclose(torch.stack(tail.logprobs), torch.stack(whole.logprobs), atol=1e-4)
    assert len(tail.logprobs) == len(tail.trace.steps) == 5
    n = len(ids) - 3
    assert starts == [0, n, n + 1, n + 2, *range(len(ids), len(ids) + 4)]
    assert hooks == [(k, n + k) for k in range(3 + 5)], "once after the prefill, then after every forward"


def test_the_recorder_can_be_kept_to_the_prefill(lm):
    ids = encode_prompt(lm, PROMPT, True)
    heard: list[bool] = []
    g = Generation(
        lm,
        "",
        feed=Feed(prompt_ids=ids, prefill_tokens=len(ids) - 2),
        decode=Decode(max_new_tokens=3),
        recording=Recording(decode=False),
        cache=CacheSetup(after_step=lambda cache, rec, step: heard.append(rec is not None)),
    )
    drive(lm, g)
    assert g.rec is not None and g.rec.n_prompt == len(ids) - 2, "the recorder's prompt is the prefill"
    assert heard == [True, False, False, False, False]
    assert g.finish().colsum is None, "no summaries laid out for a prompt the recorder did not prefill"


def test_a_repositioning_cache_is_fed_its_slot_positions(lm):
    ids = encode_prompt(lm, PROMPT, True)
    ev = Evictor(lm, make_policy("streaming_llm", reposition=True), 8, len(ids), feeds_slot_positions=True)
    g = Generation(
        lm,
        "",
        feed=Feed(prompt_ids=ids),
        decode=Decode(max_new_tokens=4, stop_on_eos=False),
        recording=Recording(on=False),
        cache=CacheSetup(factory=ev.cache_factory, after_step=ev.after_step),
    )
    assert drive(lm, g) == [0, 8, 8, 8], "after the prefill's compression every step starts at the budget"


def test_every_fed_position_is_scored_whatever_the_chunks(lm):
    """``score_tokens``: the log-probability of each next token, the prompt's and the produced ones alike."""
    ids = encode_prompt(lm, PROMPT, True)

    def scored(feed: Feed) -> Generation:
        recording = Recording(on=False, score_tokens=True, keep_logprobs=True)
        return solo(
            lm, Generation(lm, "", feed=feed, decode=Decode(max_new_tokens=3), recording=recording), wrapped=False
        )

    whole, chunked = scored(Feed(prompt_ids=ids)), scored(Feed(prompt_ids=ids, prefill_tokens=5, tail_chunk=4))
    a, b = torch.cat(whole.token_logprobs), torch.cat(chunked.token_logprobs)
    assert a.shape == (len(ids) - 1 + 3,) and torch.allclose(a, b, atol=1e-4)
    produced = whole.trace.token_ids[len(ids) :]
    assert torch.allclose(a[len(ids) - 1 :], torch.stack([lp[t] for lp, t in zip(whole.logprobs, produced)]))
    with pytest.raises(ValueError, match="record_decode=False"):
        Generation(lm, "", feed=Feed(prompt_ids=ids, prefill_tokens=5, tail_chunk=4))


def test_a_released_run_holds_no_cache(lm):
    caches = []

    def tracked(lm):
        cache = DynamicCache(config=lm.config)
        caches.append(weakref.ref(cache))
        return cache

    g = Generation(
        lm,
        PROMPT,
        decode=Decode(max_new_tokens=3),
        cache=CacheSetup(factory=tracked),
        recording=Recording(keep_logprobs=True),
    )
    drive(lm, g)
    g.finish()
    g.release()  # what the engine does when a run leaves: the recorder the last forward used goes too
    gc.collect()
    assert caches and caches[0]() is None


def test_steps_left_counts_down_to_zero(lm):
    g = Generation(lm, PROMPT, feed=Feed(chat=False), decode=Decode(max_new_tokens=4, stop_on_eos=False))
    assert g.steps_left == 4  # the prompt's forward produces the first token, then one forward per token
    seen = [g.steps_left for _ in forwards(lm, g)]
    assert seen == [3, 2, 1, 0]


def test_a_prompt_token_fed_alone_is_recorded_as_a_prompt_row(lm):
    # a prefill chunk of one token (the engine's step budget leaving one, or a prompt's last token after its
    # chunks) is a prompt query: its row belongs in the window rows and the prompt map, not in a decode row
    def traced(feed: Feed):
        g = Generation(lm, "Name three colours.", feed=feed, decode=Decode(max_new_tokens=3), recording=Recording())
        with torch.inference_mode(), installed(lm.model):
            while not g.done:
                ids, start = g.next_feed()
                g.take(forward(lm, ids, start, g.cache, g.feed_recorder)[-1], len(ids))
        return g.finish()

    whole = traced(Feed(chat=True))
    alone = traced(Feed(chat=True, prefill_chunk=whole.n_prompt - 1))  # the last prompt token in a forward of its own
    assert alone.token_ids == whole.token_ids
    for name in ("window_rows", "prefill_map", "colsum", "sink_mass", "decode_rows"):
        a, b = getattr(alone, name).astype(np.float32), getattr(whole, name).astype(np.float32)
        np.testing.assert_allclose(a, b, atol=2e-3 if name in ("prefill_map", "decode_rows") else 2e-5)
    np.testing.assert_allclose(alone.window_rows[:, :, -1].sum(-1), 1.0, atol=1e-5)  # the last prompt query's row
