"""Packed forwards: sequences decoding together attend through one call and still see only their own cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvviz.capture import packed as packed
from kvviz.capture import packed_decode
from kvviz.capture.attention_fn import installed
from kvviz.capture.generation import Generation
from kvviz.capture.model_io import encode_prompt, forward
from kvviz.capture.options import Decode, Feed, Recording
from kvviz.capture.packed import Segment, packed_forward
from kvviz.capture.prefill_rows import PROBE_ROWS
from kvviz.capture.recorder import Recorder
from kvviz.models import CaptureError

# different prompt lengths: the decoding sequences' caches differ in length, so the batched call pads and masks
PROMPTS = ["Hi", "Name three colours.", "Write one sentence about the sea and the wind over it."]
STEPS = 4


def prefilled(lm, prompt: str) -> Generation:
    g = Generation(
        lm, prompt, feed=Feed(chat=True), decode=Decode(max_new_tokens=STEPS + 1), recording=Recording(verify=True)
    )
    ids, start = g.next_feed()
    g.take(forward(lm, ids, start, g.cache, g.feed_recorder)[-1], len(ids))
    return g


def packed_step(lm, runs: list[Generation]) -> None:
    """Every run's next feed through one packed forward, each run handed its logits (inside ``installed``)."""
    feeds = [g.next_feed() for g in runs]
    segments = [Segment(ids, start, g.cache, g.feed_recorder) for g, (ids, start) in zip(runs, feeds)]
    for g, (ids, _), row in zip(runs, feeds, packed_forward(lm, segments)):
        g.take(row[-1], len(ids))


def decoded_together(lm, steps: int) -> list[Generation]:
    """:data:`PROMPTS` prefilled one by one, then ``steps`` decode steps of all of them in packed forwards."""
    with torch.inference_mode(), installed(lm.model):
        runs = [prefilled(lm, p) for p in PROMPTS]
        for _ in range(steps):
            packed_step(lm, runs)
    return runs


def test_decoding_sequences_attend_together_and_equal_their_solo_steps(lm, monkeypatch):
    calls = []
    real = packed_decode.attend_decoding

    def spy(module, implementation, query, starts, parts, *args, **kwargs):
        calls.append((module.layer_idx, [k.shape[2] for k, _ in parts]))
        return real(module, implementation, query, starts, parts, *args, **kwargs)

    monkeypatch.setattr(packed, "attend_decoding", spy)
    with torch.inference_mode(), installed(lm.model):
        alone = [prefilled(lm, p) for p in PROMPTS]
        together = [prefilled(lm, p) for p in PROMPTS]
        for _ in range(STEPS):
            solo_logits = []
            for g in alone:
                ids, start = g.next_feed()
                solo_logits.append(forward(lm, ids, start, g.cache, g.feed_recorder)[-1])
                g.take(solo_logits[-1], len(ids))
            feeds = [g.next_feed() for g in together]
            segments = [Segment(ids, start, g.cache, g.feed_recorder) for g, (ids, start) in zip(together, feeds)]
            logits = [x[-1] for x in packed_forward(lm, segments)]
            for g, (ids, _), row, ref in zip(together, feeds, logits, solo_logits):
                assert (row - ref).abs().max().item() <= 1e-4
                g.take(row, len(ids))
    layers = lm.model.config.num_hidden_layers
    assert len(calls) == layers * STEPS, "one attention call per layer for all decoding sequences"
    assert len(set(map(tuple, (lens for _, lens in calls)))) == STEPS and all(len(set(x)) == 3 for _, x in calls)
    for a, b in zip(together, alone):
        for x, y in zip(a.rec.outputs, b.rec.outputs, strict=True):  # what the equivalence check reads
            torch.testing.assert_close(x, y, atol=2e-5, rtol=1e-4)
        a.finish()
        b.finish()
        assert a.trace.token_ids == b.trace.token_ids
        for name in ("colsum", "sink_mass", "decode_rows"):
            x, y = getattr(a.trace, name), getattr(b.trace, name)
            np.testing.assert_allclose(
                x.astype(np.float32), y.astype(np.float32), atol=2e-5 if x.dtype != np.float16 else 2e-3
            )


def test_after_the_first_decode_step_each_sequence_s_row_is_recorded_without_the_general_path(lm, monkeypatch):
    general = []  # the layer of every call through the general recording path
    real = packed.record_call
    monkeypatch.setattr(
        packed,
        "record_call",
        lambda rec, module, *a, **k: general.append(module.layer_idx) or real(rec, module, *a, **k),
    )
    stepped = []  # the layers of every call handing a recorder a packed step's rows
    real_step = Recorder.record_packed_step
    monkeypatch.setattr(
        Recorder, "record_packed_step", lambda rec, layers, *a: stepped.append(layers) or real_step(rec, layers, *a)
    )
    runs = decoded_together(lm, 3)
    # the first decode step's rows are checked one by one; from the second on, the fast path takes every row,
    # each recorder hearing all layers of a step in one call
    layers = lm.model.config.num_hidden_layers
    assert len(general) == len(PROMPTS) * layers
    assert stepped == [list(range(layers))] * (len(PROMPTS) * 2)
    assert all(len(g.rec.outputs) == 4 and g.rec.outputs[-1] is not None for g in runs)  # outputs kept for the check


def test_the_first_decode_step_is_checked_for_every_decoding_sequence_at_once(lm, monkeypatch):
    checks = []  # per check: how many sequences' outputs it compared with SDPA's
    real = packed_decode.agree
    monkeypatch.setattr(packed_decode, "agree", lambda *a: checks.append(a[1].shape[0]) or real(*a))
    runs = decoded_together(lm, 2)
    assert checks == [len(PROMPTS)] * lm.model.config.num_hidden_layers  # the first step only, per layer
    assert not any(g.rec.checks_decode for g in runs)


def prefilled_together(lm) -> list[Generation]:
    """:data:`PROMPTS`' prompts through one packed forward (fresh caches of their own: padded, not slotted)."""
    runs = [
        Generation(
            lm, p, feed=Feed(chat=True), decode=Decode(max_new_tokens=STEPS + 1), recording=Recording(verify=True)
        )
        for p in PROMPTS
    ]
    with torch.inference_mode(), installed(lm.model):
        packed_step(lm, runs)
    return runs


def test_a_packed_prefill_checks_every_sequence_s_rows_in_one_call_per_layer(lm, monkeypatch):
    calls = []  # the query shape [B, Hq, rows] of every SDPA call
    real = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(
        torch.nn.functional,
        "scaled_dot_product_attention",
        lambda q, *a, **k: calls.append(tuple(q.shape[:3])) or real(q, *a, **k),
    )
    runs = prefilled_together(lm)
    config = lm.model.config
    assert calls == [(len(PROMPTS), config.num_attention_heads, PROBE_ROWS)] * config.num_hidden_layers
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", real)
    with torch.inference_mode(), installed(lm.model):
        alone = [prefilled(lm, p) for p in PROMPTS]
    assert [g.trace.token_ids for g in runs] == [g.trace.token_ids for g in alone]  # first tokens as solo prefills


def test_the_packed_prefill_probe_catches_one_sequence_the_implementation_computes_otherwise(lm, monkeypatch):
    real = torch.nn.functional.scaled_dot_product_attention

    def second_off(q, *a, **k):  # an attention variant kvviz does not model, seen in the second sequence only
        out = real(q, *a, **k)
        if out.shape[0] > 1:
            out = out.clone()
            out[1] *= 0.9
        return out

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", second_off)
    with pytest.raises(CaptureError, match="probabilities × values do not reproduce"):
        prefilled_together(lm)


def test_prefilling_sequences_attend_together_and_record_what_their_solo_prefills_record(lm, monkeypatch):
    calls = []  # per call of the batched prefill attention: how many sequences it took
    real = packed.attend_prefilling
    monkeypatch.setattr(
        packed, "attend_prefilling", lambda q, bounds, *a: calls.append(len(bounds)) or real(q, bounds, *a)
    )
    looped = []  # a recorder's own chunk loop, which the packed prefill no longer runs
    monkeypatch.setattr(Recorder, "_record_prefill", lambda rec, layer, *a, **k: looped.append(layer))
    runs = prefilled_together(lm)
    assert calls == [len(PROMPTS)] * lm.model.config.num_hidden_layers and not looped
    monkeypatch.undo()
    with torch.inference_mode(), installed(lm.model):
        alone = [prefilled(lm, p) for p in PROMPTS]
    for a, b in zip(runs, alone):
        assert a.trace.token_ids == b.trace.token_ids
        for name in ("colsum", "sink_mass", "window_rows", "prefill_map"):
            torch.testing.assert_close(getattr(a.rec, name), getattr(b.rec, name), atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(a.rec.outputs[0], b.rec.outputs[0], atol=2e-5, rtol=1e-4)


def test_a_prompt_token_fed_alone_beside_decoding_sequences_is_recorded_as_a_prompt_row(lm):
    # one token of a prompt in a packed step of decoding sequences attends with them (one query, no mask),
    # but its recorder takes it as the prompt's row it is
    prompt = PROMPTS[1]
    n = len(encode_prompt(lm, prompt, True))
    recording = Recording(verify=True)
    with torch.inference_mode(), installed(lm.model):
        runs = [prefilled(lm, p) for p in (PROMPTS[0], PROMPTS[2])]
        late = Generation(
            lm, prompt, feed=Feed(chat=True, prefill_chunk=n - 1), decode=Decode(max_new_tokens=3), recording=recording
        )
        packed_step(lm, [late])  # its first n - 1 prompt tokens
        packed_step(lm, [*runs, late])  # its last prompt token alone, beside two decoding sequences
        while not late.done:
            packed_step(lm, [late])
        whole = Generation(lm, prompt, feed=Feed(chat=True), decode=Decode(max_new_tokens=3), recording=recording)
        while not whole.done:
            packed_step(lm, [whole])
    a, b = late.finish(), whole.finish()
    assert a.token_ids == b.token_ids
    for name in ("window_rows", "prefill_map", "colsum"):
        np.testing.assert_allclose(getattr(a, name).astype(np.float32), getattr(b, name).astype(np.float32), atol=2e-3)
