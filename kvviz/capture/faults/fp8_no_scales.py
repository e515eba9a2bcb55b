"""The cache stored at lower precision than it was computed in, without scales: keys and values cast to
FP8 (E4M3) and back as they are stored."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvviz.capture.faults.base import Fault


@dataclass(frozen=True)
class Fp8NoScales(Fault):
    name = "fp8_no_scales"
    title = "FP8 cache without scales"
    source = (
        "vLLM's FP8 KV cache docs: without calibrated k/v scales the scale defaults to 1.0 "
        "(kv_cache_dtype='fp8', calculate_kv_scales)"
    )
    lesson = (
        "FP8 E4M3 keeps 3 mantissa bits: stored with scale 1 every key and value is rounded by up to 6 % and "
        "small ones flush to zero; store per-tensor or per-head scales (or keep the cache in 16 bits)."
    )
    shows = "the struck layer's keys leave their tolerance at the struck step; its output follows"
    first = "K"

    def store(self, keys, values, layer):
        def cast(x: torch.Tensor) -> torch.Tensor:
            return x.to(torch.float8_e4m3fn).to(x.dtype)

        return cast(keys), cast(values)
