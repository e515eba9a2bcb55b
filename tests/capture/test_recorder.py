"""The recorder's chunked reductions against an exact eager reference (float64) on short prompts.

A spy subclass keeps the exact queries and keys every attention call saw; the reference recomputes
softmax(QKᵀ·scale + mask) from them and reduces it the obvious way. Small chunks make the
recorder cut each prefill into several chunks (and partial bins when ``bin_factor`` > 1).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from kvviz.capture import generation as capture_mod
from kvviz.capture.decode_rows import _adjacent
from kvviz.capture.loop import capture
from kvviz.capture.recorder import Recorder, RecorderConfig
from kvviz.models import CaptureError
from tests.tiny_models import recompute_probabilities, tiny_model

N_NEW = 5


class SpyRecorder(Recorder):
    """A Recorder that also keeps every call's inputs (float64 copies)."""

    last: SpyRecorder | None = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls: list[tuple] = []
        SpyRecorder.last = self

    def record(self, layer, query, key, mask, scaling, softcap, out, **extra) -> None:
        if self.phase != "outputs":
            m = None if mask is None else mask[0, 0].clone()  # [q, k]
            self.calls.append((layer, self.t_total, query[0].double(), key[0].double(), m, scaling, softcap))
        super().record(layer, query, key, mask, scaling, softcap, out, **extra)

    def own_output(self, layer, query, key, value, mask, scaling, probe):
        out = super().own_output(layer, query, key, value, mask, scaling, probe)
        if out is not None:  # the recorder computed this call's output itself: its inputs, as record keeps them
            m = None if mask is None else mask[0, 0].clone()
            self.calls.append((layer, self.t_total, query[0].double(), key[0].double(), m, scaling, None))
        return out

    def _flush_decode(self) -> None:
        # note how many batches (cache length, scale) each decode step's plain layers formed
        self.batches = getattr(self, "batches", []) + [len({(sc.shape[-1], s) for _, sc, s in self._pending})]
        super()._flush_decode()


def eager_probs(q, k, mask, scaling, softcap, t_total) -> torch.Tensor:
    """Exact attention probabilities [Hq, q, k] in float64: the textbook formula, keys repeated per group."""
    k = k.repeat_interleave(q.shape[0] // k.shape[0], dim=0)  # [Hq, k, D]
    s = q @ k.transpose(1, 2) * (scaling if scaling is not None else q.shape[-1] ** -0.5)
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    n, kl = s.shape[-2:]
    if mask is None:
        allowed = torch.arange(kl)[None] + (t_total - kl) <= torch.arange(n)[:, None] + (t_total - n)
    elif mask.dtype == torch.bool:
        allowed = mask[:, :kl]
    else:
        s = s + mask[:, :kl].double()
        allowed = torch.ones(n, kl, dtype=torch.bool)
    return torch.softmax(s.masked_fill(~allowed, float("-inf")), dim=-1)


def reference(spy: SpyRecorder, trace) -> dict[str, np.ndarray]:
    """The trace's summaries, recomputed from exact probabilities."""
    m, t, n_prompt, f, k_sink = trace.model, trace.n_tokens, trace.n_prompt, trace.bin_factor, trace.sink_k
    w = trace.window_rows.shape[2]
    nb = -(-t // f)
    colsum = np.zeros((m.layers, m.q_heads, t))
    prefill_colsum = np.zeros((m.layers, m.q_heads, n_prompt))
    sink = np.zeros((m.layers, m.q_heads, trace.n_fed))
    window = np.zeros((m.layers, m.q_heads, w, n_prompt))
    pmap = np.zeros((m.layers, m.q_heads, -(-n_prompt // f), nb))
    drows = np.zeros((trace.n_fed - n_prompt, m.layers, m.q_heads, nb))
    for layer, t_total, q, k, mask, scaling, softcap in spy.calls:
        p = eager_probs(q, k, mask, scaling, softcap, t_total).numpy()  # [Hq, n, kl]
        n, kl = p.shape[1:]
        kpos = np.arange(t_total - kl, t_total)
        colsum[layer][:, kpos] += p.sum(1)
        sink[layer][:, t_total - n : t_total] = p[..., kpos < k_sink].sum(-1)
        binned = np.zeros((m.q_heads, n, nb))
        np.add.at(binned, (slice(None), slice(None), kpos // f), p)
        if n > 1:  # the prefill
            window[layer] = p[:, n_prompt - w :, :]
            prefill_colsum[layer] = p.sum(1)
            counts = np.bincount(np.arange(n_prompt) // f)
            for b, c in enumerate(counts):
                pmap[layer][:, b] = binned[:, b * f : b * f + c].sum(1) / c
        else:
            drows[t_total - 1 - n_prompt, layer] = binned[:, 0]
    return dict(
        colsum=colsum,
        prefill_colsum=prefill_colsum,
        sink_mass=sink,
        window_rows=window,
        prefill_map=pmap,
        decode_rows=drows,
    )


def spied_capture(monkeypatch, model, ids, cfg):
    monkeypatch.setattr(capture_mod, "Recorder", SpyRecorder)
    trace = capture(model, "", prompt_ids=ids, max_new_tokens=N_NEW, cfg=cfg)
    return trace, SpyRecorder.last


def assert_matches_reference(trace, spy):
    ref = reference(spy, trace)
    assert len({c[0] for c in spy.calls}) == trace.model.layers
    # the fp32 reductions: exact to 1e-5
    np.testing.assert_allclose(trace.colsum, ref["colsum"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(trace.sink_mass, ref["sink_mass"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(trace.window_rows, ref["window_rows"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(trace.prefill_colsum, ref["prefill_colsum"], rtol=1e-5, atol=1e-5)
    # the display data is stored in fp16: equal to fp16 rounding
    np.testing.assert_allclose(trace.prefill_map.astype(np.float64), ref["prefill_map"], atol=1e-3)
    np.testing.assert_allclose(trace.decode_rows.astype(np.float64), ref["decode_rows"], atol=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("bin_factor, chunk", [(1, 16), (3, 10)])
def test_real_model_reductions_equal_exact_attention(monkeypatch, lm, bin_factor, chunk):
    ids = lm.tokenizer("The cat sat on the mat because it was warm. " * 6)["input_ids"][:47]
    cfg = RecorderConfig(sink_k=4, obs_window=8, chunk=chunk, bin_factor=bin_factor)
    trace, spy = spied_capture(monkeypatch, lm, ids, cfg)
    assert trace.bin_factor == bin_factor and trace.n_prompt == 47
    assert spy._chunk_rows(47) < 47  # several chunks were exercised
    assert_matches_reference(trace, spy)


@pytest.mark.parametrize("name, recompute", [("gemma2", False), ("gemma2", True), ("mistral", False), ("gpt2", False)])
def test_masked_softcapped_and_mha_models_equal_exact_attention(monkeypatch, name, recompute):
    # 20 tokens: longer than the sliding window (8), so sliding layers receive an explicit mask. Gemma-2
    # runs eager (no SDPA with soft-capping): its own probabilities, or recomputed with the soft-cap
    model = tiny_model(name)
    if recompute:
        recompute_probabilities(monkeypatch)
    trace, spy = spied_capture(monkeypatch, model, list(range(100, 120)), RecorderConfig(obs_window=6, chunk=8))
    if name == "gemma2":
        assert any(c[6] is not None for c in spy.calls)  # soft-capped
    assert_matches_reference(trace, spy)


def test_hybrid_under_sdpa_is_exact(monkeypatch):
    # Gemma-3 sliding/full/sliding layers under SDPA: the full layer's decode rows go through the batched
    # path (no mask; its output from the recorder's own probabilities, checked against SDPA's on the first
    # step), the masked sliding layers through the per-layer one; both exact
    tiny = tiny_model("gemma3")
    assert tiny.model.config._attn_implementation == "sdpa"
    trace, spy = spied_capture(monkeypatch, tiny, list(range(100, 120)), RecorderConfig(obs_window=6, chunk=8))
    assert spy.batches[0] == 0 and set(spy.batches[1:]) == {1}  # prefill; then the full layer's rows, every step
    assert_matches_reference(trace, spy)


def test_decode_batches_group_layers_by_cache_length():
    # layers 0 and 2 hold 5 keys (a sliding window), layer 1 holds all 7: two batches, non-adjacent layers
    torch.manual_seed(1)
    rec = SpyRecorder(3, 4, 8, 6, RecorderConfig(sink_k=2, bin_factor=3), torch.device("cpu"))
    rec.phase, rec.t_total = "decode", 7
    qs = [torch.randn(1, 4, 1, 8) for _ in range(3)]
    ks = [torch.randn(1, 2, n, 8) for n in (5, 7, 5)]
    for layer in range(3):
        rec.record(layer, qs[layer], ks[layer], None, 0.3, None, torch.zeros(1, 1, 4, 8))
    rec.end_forward()
    assert rec.batches == [2]
    for layer in range(3):
        p = eager_probs(qs[layer][0].double(), ks[layer][0].double(), None, 0.3, None, 7).float()[:, 0]
        start = 7 - p.shape[-1]
        assert torch.allclose(rec.colsum[layer, :, start:7], p, atol=1e-6)
        assert rec.colsum[layer, :, :start].abs().sum() == 0
        assert torch.allclose(rec.sink_mass[layer, :, 6], p[:, : max(2 - start, 0)].sum(-1), atol=1e-6)
        full = torch.zeros(4, 9)
        full[:, start:7] = p
        binned = full.view(4, 3, 3).sum(-1)  # bins of 3 positions
        assert torch.allclose(rec.decode_rows[0, layer].float(), binned, atol=1e-3)


@pytest.mark.slow
def test_attention_rows_sum_to_one(monkeypatch, lm):
    ids = lm.tokenizer("Once upon a time there lived a king who had three daughters.")["input_ids"]
    trace, _ = spied_capture(monkeypatch, lm, ids, RecorderConfig(obs_window=4, chunk=5, bin_factor=2))
    assert np.allclose(trace.window_rows.sum(-1), 1.0, atol=1e-5)
    assert np.allclose(trace.prefill_map.astype(np.float32).sum(-1), 1.0, atol=3e-3)  # mean row per bin
    assert np.allclose(trace.decode_rows.astype(np.float32).sum(-1), 1.0, atol=3e-3)
    assert np.allclose(trace.colsum.sum(-1), trace.n_fed, rtol=1e-5)


def test_evicted_positions_are_scattered_to_the_right_columns():
    # an evicting cache reports which positions it still holds: 0-3 (sinks) and 10-12
    torch.manual_seed(0)
    pos = torch.tensor([0, 1, 2, 3, 10, 11, 12]).expand(2, -1)  # [Hkv, k]
    q, k = torch.randn(1, 4, 1, 8), torch.randn(1, 2, 7, 8)
    rec = Recorder(1, 4, 16, 8, RecorderConfig(sink_k=2, bin_factor=4), torch.device("cpu"))
    rec.cache = SimpleNamespace(layers=[SimpleNamespace(kv_positions=pos)])
    rec.phase, rec.t_total = "decode", 13
    rec.record(0, q, k, None, 0.5, None, torch.zeros(1, 1, 4, 8))
    p = eager_probs(q[0].double(), k[0].double(), None, 0.5, None, 7).float()[:, 0]  # [Hq, 7]
    assert torch.allclose(rec.colsum[0][:, pos[0]], p, atol=1e-6)
    assert rec.colsum[0][:, 4:10].abs().sum() == 0  # evicted positions got nothing
    assert torch.allclose(rec.sink_mass[0, :, 12], p[:, :2].sum(-1), atol=1e-6)
    row = rec.decode_rows[12 - 8, 0].float()  # bins of 4 positions: {0-3}, {8-11}, {12-15}
    assert torch.allclose(row[:, 0], p[:, :4].sum(-1), atol=1e-3)
    assert torch.allclose(row[:, 2], p[:, 4:6].sum(-1), atol=1e-3)
    assert torch.allclose(row[:, 3], p[:, 6], atol=1e-3)


def test_bad_config_is_refused():
    with pytest.raises(ValueError, match="bin_factor"):
        Recorder(1, 1, 4, 4, RecorderConfig(bin_factor=0), torch.device("cpu"))


def test_decode_scores_of_consecutive_layers_are_one_view_not_a_copy():
    rec = Recorder(layers=3, q_heads=4, t_max=10, n_prompt=6, cfg=RecorderConfig(), device=torch.device("cpu"))
    rec.phase, rec.t_total = "decode", 7
    query, key = torch.randn(1, 4, 1, 8), torch.randn(1, 2, 7, 8)
    for layer in range(3):
        rec.record(layer, query, key, None, None, None, None)
    items = [(layer, sc) for layer, sc, _ in rec._pending]
    view = _adjacent(items)
    assert view is not None and view.shape == (3, 4, 7)
    assert view.data_ptr() == rec._step_scores.data_ptr()  # the step buffer itself, no stack
    torch.testing.assert_close(view, torch.stack([sc for _, sc in items]))
    assert _adjacent(items[::2]) is None  # layers 0 and 2 are not back to back: the caller stacks them
    rec.end_forward()
    assert rec._step_used == 0 and not rec._pending
    torch.testing.assert_close(rec.colsum[:, :, :7].sum(-1), torch.ones(3, 4))  # each row a distribution


def test_only_a_plain_causal_mask_takes_the_diagonal_block_path():
    from kvviz.capture.attention_math import is_causal

    q, k = 4, 10  # a prompt chunk of 4 queries after 6 cached keys
    causal = (torch.arange(k)[None, :] <= torch.arange(k - q, k)[:, None])[None, None]  # [1, 1, q, k]
    assert is_causal(causal, k)
    assert not is_causal(causal, k + 1)  # a mask wider than the keys
    window = causal & (torch.arange(k)[None, :] > torch.arange(k - q, k)[:, None] - 5)
    assert not is_causal(window, k)  # a sliding window hides the oldest keys
    padded = causal.clone()
    padded[..., 0] = False
    assert not is_causal(padded, k)


def test_a_short_cached_prefix_is_replayed_for_every_layer_at_once_as_layer_by_layer():
    # 14 cached prompt queries in chunks of 3 over display bins of 3, the last 12 prompt queries kept as
    # window rows: the one reduction over all layers must fold in exactly what the per-layer loop does
    torch.manual_seed(2)
    scores = torch.randn(3, 4, 14, 14).masked_fill(torch.ones(14, 14, dtype=torch.bool).triu(1), float("-inf"))
    rows = torch.softmax(scores, -1)
    recs = [
        Recorder(
            3,
            4,
            30,
            20,
            RecorderConfig(sink_k=2, bin_factor=3, obs_window=12, chunk=5, chunk_elements=c),
            torch.device("cpu"),
        )
        for c in (2**22, 16)  # 16: too small for all layers at once, so layer by layer
    ]
    for rec in recs:
        rec.replay_prefix(rows)
    together, by_layer = recs
    for name in ("colsum", "sink_mass", "window_rows", "prefill_map", "prefill_colsum"):
        assert torch.equal(getattr(together, name), getattr(by_layer, name)), name
    assert together.colsum[:, :, :14].sum().item() == pytest.approx(3 * 4 * 14, rel=1e-6)  # every row once


@pytest.mark.parametrize("evicting", [(), (1,), (0, 1, 2)])
def test_a_packed_step_records_what_its_layers_recorded_one_by_one_would(evicting):
    # a packed decode step hands a recorder every layer's probabilities and outputs in one call
    # (kvviz.capture.packed_decode.StepRows); the summaries and kept outputs must be those of recording each
    # layer through the general path. An evicting layer's row is scattered by the positions it kept, also
    # when every layer holds as many keys (then only the cache tells that they are not the last ones).
    torch.manual_seed(2)
    layers, hq, width = 3, 4, 9
    lens = [5 if i in evicting else 7 for i in range(layers)]
    pos = torch.tensor([0, 1, 2, 3, 6]).expand(2, -1)  # an evicting layer keeps sinks 0-3 and position 6
    qs = [torch.randn(1, hq, 1, 8) for _ in range(layers)]
    ks = [torch.randn(1, 2, n, 8) for n in lens]
    outs = torch.randn(layers, 1, 1, hq, 8)
    probs = torch.zeros(layers, hq, width)
    for layer, n in enumerate(lens):
        probs[layer, :, :n] = eager_probs(qs[layer][0].double(), ks[layer][0].double(), None, 0.3, None, 7).float()[
            :, 0
        ]

    def recorder() -> Recorder:
        rec = Recorder(layers, hq, 10, 6, RecorderConfig(sink_k=2, bin_factor=2), torch.device("cpu"), True)
        rec.cache = SimpleNamespace(
            layers=[SimpleNamespace(kv_positions=pos if i in evicting else None) for i in range(3)]
        )
        rec.phase, rec.t_total, rec._decode_checked = "decode", 7, True
        return rec

    one_by_one, packed = recorder(), recorder()
    for layer in range(layers):
        one_by_one.record(layer, qs[layer], ks[layer], None, 0.3, None, outs[layer])
    one_by_one.end_forward()
    batch = torch.stack([torch.randn(layers, hq * 8), outs.reshape(layers, -1)])  # another sequence's beside it
    packed.record_packed_step(list(range(layers)), batch[1], probs, lens)
    packed.end_forward()
    for name in ("colsum", "sink_mass", "decode_rows"):
        torch.testing.assert_close(getattr(packed, name), getattr(one_by_one, name), atol=1e-6, rtol=1e-5)
    for layer in evicting:
        assert packed.colsum[layer, :, 4:6].abs().sum() == 0  # evicted positions got nothing
    torch.testing.assert_close(packed.outputs[-1], one_by_one.outputs[-1])
    kept = packed.outputs[-1]
    assert kept.untyped_storage().nbytes() == kept.numel() * kept.element_size()  # its own memory, not the batch's


def test_a_packed_step_handed_over_in_two_calls_keeps_every_layer_s_output():
    # a step whose layers' rows differ in width reaches the recorder in one call per width
    # (kvviz.capture.packed_decode.StepRows): every call's outputs are kept, none replaced by the next
    torch.manual_seed(3)
    layers, hq = 3, 4
    rec = Recorder(layers, hq, 10, 6, RecorderConfig(), torch.device("cpu"), True)
    rec.phase, rec.t_total, rec._decode_checked = "decode", 7, True
    outs = torch.randn(layers, hq * 8)
    probs = torch.softmax(torch.randn(layers, hq, 7), -1)
    rec.record_packed_step([0, 2], outs[[0, 2]], probs[[0, 2]], [7, 7])
    rec.record_packed_step([1], outs[[1]], probs[[1]], [7])
    rec.end_forward()
    torch.testing.assert_close(rec.outputs[-1], outs[:, None])
    torch.testing.assert_close(rec.colsum[:, :, :7], probs)


def test_a_forward_that_missed_a_layer_keeps_none_of_its_rows():
    rec = Recorder(2, 4, 10, 6, RecorderConfig(), torch.device("cpu"), True)
    rec.phase, rec.t_total, rec._decode_checked = "decode", 7, True
    rows = torch.softmax(torch.randn(3, 2, 4, 7), -1)  # a batch of three sequences' rows: held as views
    rec.record_packed_step([0], torch.randn(1, 32), rows[1, :1], [7])
    with pytest.raises(CaptureError, match="Layers 1"):
        rec.end_forward()
    assert not rec._pending_blocks and not rec._out_blocks
