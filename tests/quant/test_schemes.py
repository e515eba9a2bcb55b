"""Quantizers: round-trip error bounds per format, bytes with scales, and KIVI's result on the real model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvviz.memory.estimate import resolve_kv_dtype
from kvviz.quant.model import channel_outlier_ratio, collect_qkv, compare, evaluate, magnitude_map
from kvviz.quant.schemes import (
    FP8_MAX,
    QuantSpec,
    Scheme,
    attention_output,
    bits_per_element,
    kivi,
    preset_schemes,
    quantized_prefix,
    round_trip,
    simulate,
    stored_bytes,
)
from kvviz.units import format_bytes


@pytest.fixture(scope="module")
def x() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    base = torch.randn(3, 64, 64, generator=g)  # [heads, T, D]
    base[..., 5] += 20  # an outlier channel: large for every token, as keys have
    return base


@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize("axis", ["token", "channel"])
def test_int_round_trip_is_within_half_a_step(x, bits, axis):
    spec = QuantSpec(f"int{bits}", axis, 16)
    y = round_trip(x, spec)
    # the bound computed independently: half of (max − min) / (2^bits − 1) in each group of 16
    grouped = x.reshape(3, 64, 4, 16) if axis == "token" else x.transpose(1, 2).reshape(3, 64, 4, 16)
    step = (grouped.amax(-1) - grouped.amin(-1)) / (2**bits - 1)  # [3, *, 4]
    bound = (step / 2).unsqueeze(-1).expand_as(grouped)
    bound = bound.reshape(3, 64, 64) if axis == "token" else bound.reshape(3, 64, 64).transpose(1, 2)
    err = (y - x).abs()
    assert torch.all(err <= bound + 1e-5)
    assert err.max() > 0.2 * bound.max()  # really quantized, not a copy


def test_fp8_round_trip_uses_e4m3(x):
    spec = QuantSpec("fp8", "token", None)
    y = round_trip(x, spec)
    scale = x.abs().amax(-1, keepdim=True) / FP8_MAX  # one scale per token
    # e4m3: 3 mantissa bits → relative error ≤ 2^-4 for normal numbers; subnormal spacing 2^-9 (× scale)
    assert torch.all((y - x).abs() <= 2**-4 * x.abs() + 2**-10 * scale + 1e-7)
    # the largest element of each token maps onto 448 exactly and comes back exactly
    idx = x.abs().argmax(-1, keepdim=True)
    assert torch.allclose(y.gather(-1, idx), x.gather(-1, idx), rtol=1e-6)
    # the value grid is e4m3's: y / scale is representable in float8_e4m3fn
    grid = (y / scale).to(torch.float8_e4m3fn).float()
    assert torch.allclose(grid * scale, y, rtol=1e-6, atol=0)


def test_error_falls_with_bits_and_per_channel_isolates_the_outlier(x):
    errs = {b: (round_trip(x, QuantSpec(f"int{b}", "token", 32)) - x).norm() for b in (8, 4, 2)}
    assert errs[8] < errs[4] < errs[2]
    per_token = (round_trip(x, QuantSpec("int2", "token", 32)) - x).norm()
    per_channel = (round_trip(x, QuantSpec("int2", "channel", 32)) - x).norm()
    assert per_channel < 0.5 * per_token  # the outlier channel gets its own scale


def test_window_and_group_boundaries():
    kv = QuantSpec("int2", "channel", 32, residual=32)
    assert quantized_prefix(100, kv) == 64  # 68 left of the window, whole groups of 32 only
    assert quantized_prefix(63, kv) == 0
    assert quantized_prefix(100, QuantSpec("int2", "token", 32, residual=32)) == 68
    assert quantized_prefix(100, QuantSpec("int2", "channel", 32)) == 96
    t = torch.randn(2, 100, 64)
    y = simulate(t, kv)
    assert torch.equal(y[:, 64:], t[:, 64:])  # the recent window stays exact
    assert not torch.equal(y[:, :64], t[:, :64])


def test_bytes_count_payload_scales_and_window():
    sb = stored_bytes((3, 100, 64), QuantSpec("int4", "token", 32))
    assert (sb.payload, sb.groups, sb.meta, sb.residual) == (9600, 600, 2400, 0)
    # the memory calculator's per-vector count (fp16 scale + zero per group) agrees
    assert sb.total == 300 * resolve_kv_dtype("int4", 32).vector_bytes(64)
    ch = stored_bytes((3, 100, 64), QuantSpec("int4", "channel", 32))
    assert (ch.payload, ch.groups, ch.meta, ch.residual) == (3 * 96 * 32, 3 * 64 * 3, 3 * 64 * 3 * 4, 3 * 4 * 64 * 2)
    fp8 = stored_bytes((3, 100, 64), QuantSpec("fp8", "tensor", None))
    assert (fp8.payload, fp8.meta) == (19200, 2)  # one byte each + one fp16 scale
    two_bit = stored_bytes((1, 10, 64), QuantSpec("int2", "token", 64))
    assert two_bit.payload == 160 and two_bit.meta == 40
    assert bits_per_element(QuantSpec("int2", "token", 32), 64, 4096) == pytest.approx(3.0)  # 2 + 32 bits / 32


def test_bad_specs_are_refused():
    with pytest.raises(ValueError, match="format"):
        QuantSpec("int5")
    with pytest.raises(ValueError, match="axis"):
        QuantSpec("int4", "row")
    with pytest.raises(ValueError, match="group_size"):
        QuantSpec("int4", "token", 0)
    with pytest.raises(ValueError, match="divide"):
        round_trip(torch.randn(4, 64), QuantSpec("int4", "token", 48))


@pytest.mark.slow
def test_attention_output_matches_the_model(lm):
    """Our recomputation from the collected Q/K/V is the model's own attention output."""
    qkv = collect_qkv(lm, "The quick brown fox jumps over the lazy dog.", keep_outputs=True)
    for layer in (0, qkv.layers - 1):
        mine = attention_output(qkv.q[layer], qkv.k[layer], qkv.v[layer], qkv.scaling)  # [Hq, T, D]
        ref = qkv.model_outputs[layer].reshape(qkv.n_tokens, qkv.q.shape[1], -1).transpose(0, 1)
        assert torch.allclose(mine, ref, atol=1e-4)


@pytest.fixture(scope="module")
def qkv(lm):
    from kvviz.capture.model_io import encode_prompt
    from kvviz.examples import needle_prompt

    return collect_qkv(lm, ids=encode_prompt(lm, needle_prompt(), chat=True)[:256])  # causal: = crop(256)


@pytest.mark.slow
def test_two_bit_keys_per_channel_beat_per_token_on_the_real_model(qkv):
    """The chapter's KIVI claim, measured: at 2 bits keys want a scale per channel."""
    same_values = QuantSpec("int2", "token", 32)
    per_channel = evaluate(qkv, Scheme("K per channel", QuantSpec("int2", "channel", 32), same_values))
    per_token = evaluate(qkv, Scheme("K per token", QuantSpec("int2", "token", 32), same_values))
    # measured on SmolLM2 (256 tokens, groups of 32): ≈ 19 % vs ≈ 51 % key error
    assert per_channel.key_error * 2 < per_token.key_error
    assert per_channel.output_error < 0.75 * per_token.output_error
    assert per_channel.value_error == per_token.value_error
    # why: keys have outlier channels, values do not
    assert np.median(channel_outlier_ratio(qkv, "k")) > 2 * np.median(channel_outlier_ratio(qkv, "v"))
    assert magnitude_map(qkv, 3, 1, "k").shape == (qkv.head_dim, qkv.n_tokens)


@pytest.mark.slow
def test_scheme_table_on_the_real_model(qkv):
    schemes = [s for s in preset_schemes() if s.name.startswith(("FP8 e4m3 per", "INT8", "2-bit per token"))]
    schemes.append(kivi(2))
    df, results = compare(qkv, schemes)
    by = {r.scheme.name: r for r in results}
    assert by["INT8 per token"].output_error < by["FP8 e4m3 per token"].output_error < 0.1
    assert by[kivi(2).name].key_error < 0.5 * by["2-bit per token (K and V)"].key_error
    assert all(r.total_bytes < r.baseline_bytes for r in results)
    assert list(df["cache"]) == [format_bytes(r.total_bytes) for r in results]
