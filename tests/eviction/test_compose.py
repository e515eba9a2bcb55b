"""Full cache, the policy, the quantization and both on one prompt: the four-way table."""

from __future__ import annotations

from kvviz.capture.model_io import encode_prompt
from kvviz.eviction.compose import compose, schemes
from kvviz.eviction.policies import make_policy
from kvviz.quant.schemes import kivi


def test_compose_measures_the_four_caches(lm):
    ids = encode_prompt(lm, "The code for the locker is 3390. The library closes at six. What is the code?", True)
    assert set(schemes()) == {"KIVI-4", "KIVI-2", "INT8 per token", "FP8 per token"}
    scheme = kivi(4, group_size=8, residual=8)  # a short prompt: a small window leaves something to quantize
    comp = compose(lm, ids, make_policy("knorm"), scheme, ratio=0.5, max_new_tokens=3)
    full, policy, quant, both = comp.rows
    assert full.name == "full cache" and full.top1_agreement == 1.0 and full.served_bytes == comp.full_bytes
    assert full.served_bytes == len(ids) * 30 * 3 * 64 * 2 * 2
    assert policy.served_bytes == int(len(ids) * 0.5) * 30 * 3 * 64 * 2 * 2
    assert both.served_bytes < policy.served_bytes and both.served_bytes < quant.served_bytes < full.served_bytes
    for row in (policy, quant, both):
        assert 0.0 <= row.top1_agreement <= 1.0 and row.mean_kl >= 0.0 and isinstance(row.answer, str)
    assert list(comp.frame()["cache"]) == [r.name for r in comp.rows]
