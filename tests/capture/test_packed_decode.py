"""The decoding segments of a packed forward attended together: their outputs from their own probabilities,
the padding never attended, and the first step's check catching an implementation they do not reproduce."""

from __future__ import annotations

import types

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from kvviz.capture import packed_decode
from kvviz.models import CaptureError


def _decoding_batch(b=3, hkv=2, g=3, width=7, d=8):
    """Random one-query segments over padded caches of lengths 7, 4 and 2, with a stand-in layer module."""
    torch.manual_seed(0)
    q, key, value = torch.randn(1, hkv * g, b, d), torch.randn(b, hkv, width, d), torch.randn(b, hkv, width, d)
    lens = [7, 4, 2][:b]
    module = types.SimpleNamespace(layer_idx=0, num_key_value_groups=g, is_causal=True, training=False)
    parts = [(key[j : j + 1, :, :n], value[j : j + 1, :, :n]) for j, n in enumerate(lens)]
    return module, q, parts, (key, value, lens)


def test_decoding_outputs_from_their_own_probabilities_equal_sdpa_and_ignore_padding():
    module, q, parts, (key, value, lens) = _decoding_batch()
    value[2, :, 2:] = 99.0  # padding of the shortest segment: never attended
    starts = list(range(len(parts)))
    with torch.inference_mode():
        mine, probs, own = packed_decode.attend_decoding(module, sdpa_attention_forward, q, starts, parts, own=True)
        ref, scores, plain = packed_decode.attend_decoding(module, sdpa_attention_forward, q, starts, parts)
        slotted = packed_decode.attend_decoding(
            module, sdpa_attention_forward, q, starts, parts, own=True, check=True, batched=(key, value, lens)
        )
    assert own and not plain
    for a, b, c in zip(mine, ref, slotted[0]):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(c, b, atol=1e-6, rtol=1e-5)
    for j, n in enumerate(lens):
        torch.testing.assert_close(probs[j, :, :n].sum(-1), torch.ones(probs.shape[1]))
        assert (probs[j, :, n:] == 0).all()
        torch.testing.assert_close(probs[j, :, :n], torch.softmax(scores[j, :, :n] * 8**-0.5, -1))


def test_the_first_decode_check_catches_an_implementation_the_probabilities_do_not_reproduce():
    module, q, parts, _ = _decoding_batch()

    def shifted(*args, **kwargs):  # an attention variant kvviz does not model: one head of one sequence off
        out, w = sdpa_attention_forward(*args, **kwargs)
        out = out.clone()
        out[1, 0, 4] += 0.1
        return out, w

    starts = list(range(len(parts)))
    with torch.inference_mode():
        packed_decode.attend_decoding(module, shifted, q, starts, parts, own=True)  # not checked: later steps trust it
        with pytest.raises(CaptureError, match="layer 0 faithfully"):
            packed_decode.attend_decoding(module, shifted, q, starts, parts, own=True, check=True)


def test_the_batched_decode_check_catches_an_output_its_rows_do_not_reproduce():
    torch.manual_seed(0)
    b, hkv, g, width, d = 3, 2, 3, 7, 8
    q, key, value = torch.randn(b, hkv * g, 1, d), torch.randn(b, hkv, width, d), torch.randn(b, hkv, width, d)
    lens = torch.tensor([7, 4, 2])
    mask = (torch.arange(width) < lens[:, None])[:, None, None]  # [B, 1, 1, k]
    out = torch.nn.functional.scaled_dot_product_attention(
        q, key.repeat_interleave(g, 1), value.repeat_interleave(g, 1), attn_mask=mask
    ).transpose(1, 2)  # [B, 1, Hq, D]
    scores = (q.view(b, hkv, g, d) @ key.transpose(2, 3)).view(b, hkv * g, width)
    packed_decode.check_decoding(0, scores, value, mask, out, d**-0.5, torch.float32)
    wrong = out.clone()
    wrong[1, 0, 4] += 0.1  # one head of one sequence
    with pytest.raises(CaptureError, match="layer 0 faithfully"):
        packed_decode.check_decoding(0, scores, value, mask, wrong, d**-0.5, torch.float32)
    padded = value.clone()
    padded[2, :, 2:] = 99.0  # another sequence's padding must not count
    packed_decode.check_decoding(0, scores, padded, mask, out, d**-0.5, torch.float32)


def test_a_step_s_rows_reach_each_recorder_once_per_width_and_device():
    # a dispatched model's layers may sit on several devices: their rows are never stacked together
    calls = []

    class Heard:
        def record_packed_step(self, layers, outs, probs, lens):
            calls.append((layers, probs.device.type, tuple(probs.shape)))

    rows = packed_decode.StepRows()
    for layer, device in enumerate(["cpu", "meta", "cpu"]):
        rows.add(layer, torch.zeros(2, 1, 4, 8, device=device), torch.zeros(2, 4, 5, device=device), [5, 3])
    rows.hand_over([Heard(), None])
    assert sorted(calls) == [([0, 2], "cpu", (2, 4, 5)), ([1], "meta", (1, 4, 5))]
