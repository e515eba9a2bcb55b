"""The architecture matrix: kvviz's capture against each model's own transformers code, on tiny random models.

For every architecture in ``tests/tiny_models.py``: greedy tokens equal the model's own eager
``generate``, logits equal the unpatched model's, the recorded prefill attention equals eager
``output_attentions`` (with a learned sink's share recorded beside it), and the cache's tensors hold
exactly the bytes the memory calculator's formula gives for that config, at every step.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvviz.capture.loop import capture
from kvviz.memory.estimate import live_cache_bytes_formula
from tests.tiny_models import CONFIG_NAMES, tiny_model

pytestmark = pytest.mark.slow  # a tiny model per architecture, each generating

PROMPT = list(range(100, 120))  # 20 tokens, longer than the sliding windows and chunks of 8
NEW = 6
ATTENTION = {
    "gpt2": "MHA",
    "gpt_neox": "MHA",
    "bloom": "MHA",
    "falcon": "MQA",
    "falcon_alibi": "MQA",
    "llama_mqa": "MQA",
    "gpt_bigcode": "MQA",
    "deepseek_v2": "MLA",
    "deepseek_v3": "MLA",
    "deepseek_v32": "MLA",
    "gemma4": "MQA",
}


class Run:
    """One architecture: the model as loaded, an eager copy with the same weights, and the capture."""

    def __init__(self, name: str):
        self.name = name
        self.lm = tiny_model(name)
        eos = self.lm.config.eos_token_id
        self.lm.stop_ids = {eos} if isinstance(eos, int) else set(eos or [])  # stop where generate stops
        self.eager = tiny_model(name, attn_implementation="eager")
        self.eager.model.load_state_dict(self.lm.model.state_dict())
        self.trace = capture(self.lm, "", prompt_ids=PROMPT, max_new_tokens=NEW, verify=True)
        ids = torch.tensor([PROMPT])
        with torch.inference_mode():
            self.generated = self.eager.model.generate(ids, max_new_tokens=NEW, do_sample=False)[0].tolist()
            out = self.eager.model(input_ids=ids, output_attentions=True, use_cache=False)
        self.attentions = torch.stack([a[0] for a in out.attentions]).float().numpy()  # [Lyr, Hq, L, L]


@pytest.fixture(scope="module", params=CONFIG_NAMES)
def run(request) -> Run:
    return Run(request.param)


def test_greedy_tokens_equal_the_models_own_eager_generate(run):
    assert run.trace.token_ids == run.generated, run.name


def test_logits_equal_the_unpatched_model(run):
    eq = run.trace.equivalence
    assert eq["unpatched_reference"] is True
    assert eq["max_abs_logit_diff_vs_unpatched"] < 1e-4, run.name  # the capture changes nothing
    assert eq["max_abs_logit_diff"] < 1e-4, run.name  # cached decoding = full recomputation
    if eq["max_abs_attn_output_diff"] is not None:  # legacy attention hands over no output
        assert eq["max_abs_attn_output_diff"] < 1e-4, run.name


def test_prefill_attention_equals_eager_output_attentions(run):
    t = run.trace
    assert t.bin_factor == 1 and t.window_rows.shape[2] == len(PROMPT)  # every prompt row, exact fp32
    np.testing.assert_allclose(t.window_rows, run.attentions, atol=1e-5, err_msg=run.name)
    shown = t.prefill_map[..., : len(PROMPT)].astype(np.float32)  # the display map, fp16
    np.testing.assert_allclose(shown, run.attentions, atol=2e-3, err_msg=run.name)
    learned = 1.0 - run.attentions.sum(-1)  # [Lyr, Hq, L]: what eager's rows do not give to any key
    if t.model.learned_sinks:
        assert learned.max() > 0.01, run.name
        np.testing.assert_allclose(t.learned_sink_mass[..., : len(PROMPT)], learned, atol=1e-5, err_msg=run.name)
    else:
        assert t.learned_sink_mass is None and np.abs(learned).max() < 1e-5, run.name


def test_attention_rows_sum_to_one_with_the_learned_sink(run):
    t = run.trace
    sink = t.learned_sink_mass.sum(-1) if t.learned_sink_mass is not None else 0.0
    np.testing.assert_allclose(t.colsum.sum(-1) + sink, t.n_fed, rtol=1e-5, err_msg=run.name)


def test_cache_bytes_equal_the_formula_at_every_step(run):
    t = run.trace
    assert len(t.steps) == len(run.generated) - len(PROMPT)
    for step in t.steps:
        f = live_cache_bytes_formula(run.lm.config, step.position, dtype_bytes=4)
        assert step.cache_lens == f["tokens_held"], run.name
        assert step.layer_bytes == f["layer_bytes"], run.name
    m = t.model
    assert m.attention == ATTENTION.get(run.name, "GQA"), run.name
    assert t.steps[0].cache_bytes == len(PROMPT) * m.kv_bytes_per_token or any(
        k != "full_attention" for k in m.layer_kinds
    ), run.name


def test_mla_caches_one_latent_and_one_rope_key():
    run = Run("deepseek_v3")
    m, held = run.trace.model, run.trace.n_fed
    assert (m.stored_heads, m.stored_dims, m.stored_names) == (1, (32, 8), ("latent", "RoPE key"))
    assert m.kv_bytes_per_token == 2 * (32 + 8) * 4  # no factor 2, no heads
    assert run.trace.key_norms.shape == (2, 1, held + 1) and run.trace.key_channel_absmean.shape == (2, 1, 32)
    assert run.trace.value_channel_absmean.shape == (2, 1, 8)
