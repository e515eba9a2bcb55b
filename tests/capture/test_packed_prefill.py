"""The prefilling segments of a packed forward attended together: each query sees its own keys up to itself
(a cached prefix included), and a recorder handed the rows records what its own chunk loop records."""

from __future__ import annotations

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from kvviz.capture.attention_math import Extras
from kvviz.capture.packed_decode import padded
from kvviz.capture.packed_prefill import attend_prefilling
from kvviz.capture.recorder import Recorder, RecorderConfig

HKV, G, D = 2, 3, 8  # key-value heads, queries per key-value head, head size


def _segments(sizes=(5, 9, 3), cached=(4, 0, 11)):
    """Random segments of ``sizes`` new queries each after ``cached`` keys already in their caches, packed in one
    row as a packed forward hands them over: the row's queries [1, Hq, N, D], each segment's keys and values."""
    torch.manual_seed(4)
    query = torch.randn(1, HKV * G, sum(sizes), D)
    parts = [(torch.randn(1, HKV, c + n, D), torch.randn(1, HKV, c + n, D)) for n, c in zip(sizes, cached)]
    starts = torch.tensor([0, *sizes]).cumsum(0).tolist()
    return query, parts, list(zip(starts[:-1], starts[1:]))


def test_each_query_attends_to_its_own_keys_up_to_itself_as_sdpa_does():
    query, parts, bounds = _segments()
    module = type("Layer", (), {"num_key_value_groups": G, "is_causal": True, "training": False})()
    with torch.inference_mode():
        out, probs = attend_prefilling(query, bounds, padded(parts), D**-0.5, {})
        for j, ((a, b), (key, value)) in enumerate(zip(bounds, parts)):
            n, k = b - a, key.shape[2]
            allowed = torch.arange(k)[None] <= torch.arange(k - n, k)[:, None]  # a cached prefix, then causal
            ref, _ = sdpa_attention_forward(module, query[:, :, a:b], key, value, allowed[None, None], scaling=D**-0.5)
            torch.testing.assert_close(out[j, :, :n].transpose(0, 1), ref[0], atol=1e-6, rtol=1e-5)
            assert (probs[j, :, :n, k:] == 0).all()  # another segment's padding: never attended
            torch.testing.assert_close(probs[j, :, :n, :k].sum(-1), torch.ones(HKV * G, n))


def test_a_recorder_handed_the_rows_records_what_its_own_chunk_loop_records():
    # 9 new queries after 4 cached keys, in chunks of 4 rows: the rows cross chunk boundaries (4 → 8 → 12)
    query, parts, bounds = _segments(sizes=(9, 2), cached=(4, 5))
    key, value = parts[0]
    (a, b) = bounds[0]
    with torch.inference_mode():
        out, probs = attend_prefilling(query, bounds, padded(parts), D**-0.5, {})

    def recorder() -> Recorder:
        rec = Recorder(2, HKV * G, 16, 13, RecorderConfig(chunk=4, sink_k=2, obs_window=6), torch.device("cpu"), True)
        rec.phase, rec.t_total = "prefill", 13
        return rec

    own, handed = recorder(), recorder()
    mine = own._record_prefill(1, query[:, :, a:b], key, None, D**-0.5, None, Extras(), value, None, emit=True)
    handed.take_prefill(1, probs[0, :, : b - a, : key.shape[2]], out[0, :, : b - a].transpose(0, 1)[None])
    for name in ("colsum", "sink_mass", "window_rows", "prefill_map"):
        torch.testing.assert_close(getattr(handed, name), getattr(own, name), atol=1e-6, rtol=1e-5)
    assert own.colsum[1].sum() > 0
    assert mine is not None
    torch.testing.assert_close(handed._out_step[1], mine[0].reshape(b - a, -1), atol=1e-6, rtol=1e-5)
