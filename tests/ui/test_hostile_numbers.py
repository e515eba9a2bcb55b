"""Any well-formed JSON of numbers to /memory, /evict and /generate: a result or a clear message, fast, and
no memory kept. The checks exercised here are exactly what runs before a job is admitted to the model."""

from __future__ import annotations

import dataclasses
import json
import math
import time

import gradio as gr
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvviz.eviction.policies import POLICIES
from kvviz.limits import CONFIG_BOUNDS
from kvviz.process_memory import current_rss
from kvviz.settings import Settings
from kvviz.ui.eviction import tab as tab_eviction
from kvviz.ui.generate import tab as tab_generate
from kvviz.ui.memory import tab as tab_memory
from kvviz.ui.serving.context import AppContext

NUMBERS = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=False, allow_infinity=False, width=64),
    st.sampled_from([0, -1, 1, 2, 10**9, 2**63, -(2**63), 0.5, 1e300, -1e-300]),
)
HOSTILE = st.one_of(
    NUMBERS,
    st.sampled_from(["NaN", "nan", "Infinity", "-inf", "1e999", "", " ", "12abc", "0x10"]),
    st.none(),
    st.booleans(),
)
BASE = {
    "model_type": "llama",
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 4096,
    "max_position_embeddings": 8192,
}
FIELDS = sorted(CONFIG_BOUNDS) + ["_num_parameters", "layer_types"]
MODEL_TYPES = ["llama", "qwen2", "gemma2", "gpt_oss", "mamba2", "jamba", "deepseek_v3", "llama4_text"]
RUN = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def ctx(lm):
    return AppContext(lm=lm, settings=Settings(max_new_tokens=64))


@pytest.fixture(scope="module")
def rss_start():
    return current_rss()


def _plain(value) -> bool:
    """A value a check may accept: a finite number (never a bool), or left blank (None or spaces)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return True
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _answered(fn, *used) -> None:
    """``fn`` returns a result or raises gr.Error with a short, readable message, within 2 s; a result only
    when every input it ``used`` is plain (``NaN``, ``1e999``, ``12abc``, ``0x10`` or a bool accepted is a
    hostile value passed silently into the model's job)."""
    start = time.perf_counter()
    try:
        fn()
    except gr.Error as exc:
        assert 0 < len(exc.message) < 600 and "Traceback" not in exc.message
    else:
        hostile = [v for v in used if not _plain(v)]
        assert not hostile, f"accepted hostile input {hostile!r}"
    assert time.perf_counter() - start < 2.0


@RUN
@given(model_type=st.sampled_from(MODEL_TYPES), fields=st.dictionaries(st.sampled_from(FIELDS), HOSTILE, max_size=4))
def test_any_config_to_memory(ctx, rss_start, model_type, fields):
    cfg = {**BASE, "model_type": model_type, **fields}
    text = (
        json.dumps(cfg, allow_nan=False)
        if all(not (isinstance(v, float) and not math.isfinite(v)) for v in cfg.values())
        else json.dumps(BASE)
    )
    _answered(lambda: tab_memory.api_memory(ctx, text, 8192, 1, "bf16", None, 8, 80, 0.1, 140, 3.35))
    assert current_rss() - rss_start < 256 * 2**20


@RUN
@given(
    context=HOSTILE,
    batch=HOSTILE,
    tp=HOSTILE,
    gpus=HOSTILE,
    mem=HOSTILE,
    reserve=HOSTILE,
    weights=HOSTILE,
    bandwidth=HOSTILE,
    group=HOSTILE,
)
def test_any_numbers_to_memory(ctx, rss_start, context, batch, tp, gpus, mem, reserve, weights, bandwidth, group):
    _answered(
        lambda: tab_memory.api_memory(
            ctx, "Llama-3-70B", context, batch, "int4", tp, gpus, mem, reserve, weights, bandwidth, group
        ),
        context,
        batch,
        tp,
        gpus,
        mem,
        reserve,
        weights,
        bandwidth,
        group,
    )
    assert current_rss() - rss_start < 256 * 2**20


@RUN
@given(max_new=HOSTILE, temperature=HOSTILE, top_p=HOSTILE, seed=HOSTILE)
def test_any_numbers_to_generate(ctx, max_new, temperature, top_p, seed):
    _answered(
        lambda: tab_generate.validate_request(
            ctx, "The capital of France is", False, max_new, temperature, top_p, seed
        ),
        max_new,
        temperature,
        top_p,
        seed,
    )


@RUN
@given(
    policy=st.sampled_from(["snapkv", "h2o", "streaming_llm", "window", "full", "nope"]),
    budget=HOSTILE,
    ratio=HOSTILE,
    max_new=HOSTILE,
    params=st.dictionaries(
        st.sampled_from(["sinks", "window_size", "kernel_size", "heavy_fraction", "pooling"]), HOSTILE, max_size=3
    ),
)
def test_any_numbers_to_evict(ctx, policy, budget, ratio, max_new, params):
    mode = "tokens" if ratio is None else "ratio"
    _answered(
        lambda: tab_eviction.check_request(
            ctx,
            "A long passage. " * 20,
            "",
            False,
            policy,
            mode,
            budget,
            ratio,
            max_new,
            params,
            tab_eviction.COMPRESS_QUESTION,
        ),
        budget if mode == "tokens" else ratio,
        max_new,
        *[v for k, v in params.items() if k in _fields(policy)],
    )


def _fields(policy: str) -> set[str]:
    """The parameters ``policy`` reads (a value given for another policy's parameter is never used)."""
    return {f.name for f in dataclasses.fields(POLICIES[policy])} if policy in POLICIES else set()
