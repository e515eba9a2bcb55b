"""The capture is the model's own attention or it refuses: learned sinks, the output check, the unpatched
reference, legacy attention and the architectures kvviz cannot capture (tiny random models)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvviz.adapters.transformers import uses_attention_interface
from kvviz.capture import attention_fn as attention_fn
from kvviz.capture.architectures import build
from kvviz.capture.attention_fn import is_installed
from kvviz.capture.attention_math import check_output
from kvviz.capture.loop import capture
from kvviz.models import CaptureError, check_capturable
from tests.tiny_models import COMMON, recompute_probabilities, tiny_config, tiny_model

PROMPT = list(range(100, 120))


def test_recomputed_probabilities_include_the_learned_sinks(monkeypatch):
    lm = tiny_model("gpt_oss")
    exact = capture(lm, "", prompt_ids=PROMPT, max_new_tokens=4)  # eager: its own probabilities
    recompute_probabilities(monkeypatch)
    recomputed = capture(lm, "", prompt_ids=PROMPT, max_new_tokens=4)
    assert recomputed.token_ids == exact.token_ids
    np.testing.assert_allclose(recomputed.colsum, exact.colsum, atol=1e-5)
    np.testing.assert_allclose(recomputed.learned_sink_mass, exact.learned_sink_mass, atol=1e-5)
    assert exact.learned_sink_mass.mean() > 0.05  # the sinks take a real share


def test_dropping_the_learned_sinks_is_caught_not_recorded(monkeypatch):
    # what kvviz used to do: probabilities without the sink column, which do not give the layer's output
    recompute_probabilities(monkeypatch)
    monkeypatch.setattr(attention_fn, "_learned_sinks", lambda kwargs, heads: None)
    with pytest.raises(CaptureError, match="do not reproduce the layer's own attention output"):
        capture(tiny_model("gpt_oss"), "", prompt_ids=PROMPT, max_new_tokens=2)


def test_output_check_compares_probabilities_times_values():
    torch.manual_seed(0)
    probs = torch.softmax(torch.randn(4, 3, 5), -1)  # [Hq, n, k]
    value = torch.randn(1, 2, 5, 8)  # two KV heads, each shared by two query heads
    out = torch.einsum("hnk,hkd->nhd", probs, value[0].repeat_interleave(2, 0))[None]  # [1, n, Hq, D]
    check_output(0, probs, value, out)
    with pytest.raises(CaptureError, match="layer 3"):
        check_output(3, probs, value, out * 0.9)


def testplain_sdpa_output_comes_from_the_recorders_probabilities(lm, monkeypatch):
    """Plain causal SDPA: the recorder's probabilities × values are the layer's output (SDPA itself only
    probes the last queries), and the run equals one where SDPA computes every output."""
    from kvviz.capture.recorder import Recorder

    ids = lm.tokenizer("The cache keeps every key and value the model has seen so far.")["input_ids"]
    own = []
    real = Recorder.own_output

    def counted(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        own.append(out is not None)
        return out

    monkeypatch.setattr(Recorder, "own_output", counted)
    mine = capture(lm, "", prompt_ids=ids, max_new_tokens=6, verify=True)
    assert own and all(own) and len(own) == lm.model.config.num_hidden_layers * 6
    assert mine.equivalence["max_abs_logit_diff_vs_unpatched"] < 1e-4
    monkeypatch.setattr(attention_fn, "plain_sdpa", lambda *args: False)
    theirs = capture(lm, "", prompt_ids=ids, max_new_tokens=6)
    assert mine.token_ids == theirs.token_ids
    for name in ("colsum", "sink_mass", "window_rows"):
        np.testing.assert_allclose(getattr(mine, name), getattr(theirs, name), atol=1e-5, err_msg=name)


def test_an_sdpa_that_computes_something_else_is_caught(lm, monkeypatch):
    real = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", lambda *a, **k: real(*a, **k) * 0.9)
    with pytest.raises(CaptureError, match="probabilities × values do not reproduce the layer's own attention"):
        capture(lm, "", prompt_ids=PROMPT, max_new_tokens=2)


def test_unpatched_reference_catches_a_capture_that_changes_the_output(monkeypatch):
    # a capture that scales the scores differently stays self-consistent (its cached and recomputed
    # runs agree) but no longer computes the model: only the unpatched reference sees it
    real = attention_fn._implementation

    def implementation(module, impl):
        fn = real(module, impl)
        return lambda *args, scaling=None, **kwargs: fn(*args, scaling=scaling * 3, **kwargs)

    monkeypatch.setattr(attention_fn, "_implementation", implementation)
    eq = capture(tiny_model("gemma2"), "", prompt_ids=PROMPT, max_new_tokens=4, verify=True).equivalence
    assert eq["max_abs_logit_diff"] < 1e-4
    assert eq["max_abs_logit_diff_vs_unpatched"] > 1e-3


def test_legacy_attention_is_captured_through_its_own_eager_path_and_left_as_found():
    lm = tiny_model("bloom")  # attention outside the interface (Falcon was too before transformers 5.25)
    trace = capture(lm, "", prompt_ids=PROMPT, max_new_tokens=3, verify=True)
    assert trace.equivalence["max_abs_logit_diff_vs_unpatched"] < 1e-4
    assert not is_installed(lm.model) and lm.model.config._attn_implementation == "eager"
    assert all(not m._forward_hooks for m in lm.model.modules())


def test_legacy_attention_whose_eager_path_differs_is_refused():
    # Falcon with ALiBi under SDPA: its eager path (the one returning probabilities) adds ALiBi twice
    config = tiny_config("falcon_alibi")
    from transformers import AutoConfig, AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(
        AutoConfig.for_model(config.pop("model_type"), **config), attn_implementation="sdpa"
    ).eval()
    lm = build(tiny_config("falcon_alibi"))
    lm.model = model
    if uses_attention_interface(model):  # transformers >= 5.25: Falcon's ALiBi arrives in the mask, captured as is
        trace = capture(lm, "", prompt_ids=PROMPT, max_new_tokens=2, verify=True)
        assert trace.equivalence["max_abs_logit_diff_vs_unpatched"] < 1e-4
    else:
        with pytest.raises(CaptureError, match="loaded with sdpa attention.*attn_implementation='eager'"):
            capture(lm, "", prompt_ids=PROMPT, max_new_tokens=2)
    assert model.config._attn_implementation == "sdpa" and not is_installed(model)


@pytest.mark.parametrize(
    "config, feature",
    [
        (
            dict(
                model_type="qwen3_next",
                **{**COMMON, "num_hidden_layers": 4},
                num_key_value_heads=2,
                head_dim=16,
                linear_num_key_heads=2,
                linear_num_value_heads=4,
                linear_key_head_dim=8,
                linear_value_head_dim=8,
                num_experts=4,
                num_experts_per_tok=2,
                moe_intermediate_size=32,
                shared_expert_intermediate_size=32,
            ),
            "linear-attention / state-space layers",
        ),
        (
            dict(model_type="mamba", vocab_size=256, hidden_size=64, num_hidden_layers=2, state_size=8),
            "linear-attention / state-space layers",
        ),
    ],
)
def test_architectures_kvviz_cannot_capture_say_which_feature(config, feature):
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(config)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(fields.pop("model_type"), **fields))
    with pytest.raises(CaptureError) as err:
        check_capturable(model)
    message = str(err.value)
    assert feature in message and config["model_type"] in message and "\n" not in message
