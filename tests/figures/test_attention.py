"""Attention and sink figures: exact for a short real run, downsampled for a long one, every figure captioned.

The long trace is built from plain arrays of a 4,096 + 256 token SmolLM2 run (figures are pure
functions of the Trace, so no model is needed to check what they send to the browser).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvviz.capture.loop import capture
from kvviz.capture.trace import ModelInfo, Step, Trace
from kvviz.figures import attention as fa
from kvviz.figures import sinks as fs

pytestmark = pytest.mark.slow  # the figures draw a real capture

SMOL = dict(
    name="SmolLM2-135M-Instruct",
    model_type="llama",
    layers=30,
    q_heads=9,
    kv_heads=3,
    head_dim=64,
    dtype="float32",
    bytes_per_element=4,
    layer_kinds=["full_attention"] * 30,
    sliding_window=None,
    context_length=8192,
    param_count=134515008,
    weight_bytes=538060032,
    device="cpu",
)


@pytest.fixture(scope="module")
def short(lm):
    return capture(lm, "What is the capital of France?", chat=True, max_new_tokens=8)


def _rows(rng, shape, visible):
    """Random attention rows (each sums to 1 over the first ``visible`` entries of the last axis)."""
    x = rng.random(shape, dtype=np.float32) ** 4
    x[..., visible:] = 0
    return x / x.sum(-1, keepdims=True)


@pytest.fixture(scope="module")
def long_trace():
    """A 4,096 + 256 token trace with the shapes capture gives (bin factor 22), random but valid rows."""
    rng = np.random.default_rng(0)
    n_prompt, n_new, f = 4096, 256, 22
    t = n_prompt + n_new
    n_fed = t - 1
    nb, nqb = -(-t // f), -(-n_prompt // f)
    info = ModelInfo(**SMOL)
    tokens = [f"w{i}" for i in range(t)]
    pmap = np.zeros((30, 9, nqb, nb), dtype=np.float32)
    for b in range(nqb):  # query bin b sees key bins 0 … b
        pmap[:, :, b] = _rows(rng, (30, 9, nb), b + 1)
    drows = np.stack([_rows(rng, (30, 9, nb), -(-(n_prompt + s + 1) // f)) for s in range(n_new - 1)])
    colsum = rng.random((30, 9, t), dtype=np.float32)
    colsum[..., 0] += n_fed * 0.5
    colsum *= n_fed / colsum.sum(-1, keepdims=True)
    steps = [Step(i, 7, "w", n_prompt + i, [n_prompt + i] * 30, [0] * 30, 0.0) for i in range(n_new)]
    return Trace(
        model=info,
        prompt="",
        chat=False,
        settings={},
        token_ids=list(range(t)),
        tokens=tokens,
        n_prompt=n_prompt,
        steps=steps,
        bin_factor=f,
        colsum=colsum,
        prefill_map=pmap.astype(np.float16),
        decode_rows=drows.astype(np.float16),
        window_rows=_rows(rng, (30, 9, 64, n_prompt), n_prompt),
        key_norms=rng.random((30, 3, t), dtype=np.float32),
        value_norms=rng.random((30, 3, t), dtype=np.float32),
    )


def _cells(fig) -> int:
    return int(sum(np.asarray(tr.z, dtype=object).size for tr in fig.data if tr.type == "heatmap"))


def test_short_run_heatmap_is_exact(short):
    grid = fa.attention_grid(short, 10, 4)
    t = short.n_tokens
    assert grid["exact"]
    assert grid["z"].shape == (short.n_fed, t)  # one row per fed query, one column per token
    assert np.allclose(np.nansum(grid["z"], 1), 1.0, atol=3e-3)  # each row sums to 1
    # the causal triangle is blank: query i has no cell for keys after i
    assert np.isnan(grid["z"][0, 1:]).all() and not np.isnan(grid["z"][5, :6]).any()
    assert grid["n_prefill_rows"] == short.n_prompt


def test_group_mean_is_the_mean_of_the_group(short):
    members = fa.attention_grid(short, 10, 4, group_mean=True)["heads"]
    assert members == [3, 4, 5]
    mean = np.mean([fa.attention_grid(short, 10, h)["z"] for h in members], axis=0)
    assert np.allclose(fa.attention_grid(short, 10, 4, group_mean=True)["z"], mean, atol=1e-6, equal_nan=True)


def test_long_trace_heatmap_is_downsampled_before_it_is_sent(long_trace):
    fig = fa.attention_heatmap(long_trace, 12, 0, log=True)
    assert _cells(fig) <= fa.MAX_SIDE**2
    heat = fig.data[0]
    assert len(heat.x) <= fa.MAX_SIDE and len(heat.y) <= fa.MAX_SIDE
    payload = len(fig.to_json())
    assert payload < 1_500_000, payload  # typed arrays, token text once per axis
    grid = fa.attention_grid(long_trace, 12, 0)
    assert np.allclose(np.nansum(grid["z"], 1), 1.0, atol=5e-3)  # pooling keeps rows summing to 1
    # the boundary between prompt and generated rows survives the pooling
    spans = grid["row_spans"]
    assert spans[grid["n_prefill_rows"] - 1][1] == long_trace.n_prompt == spans[grid["n_prefill_rows"]][0]


def test_hover_labels_name_the_tokens(short):
    fig = fa.attention_heatmap(short, 3, 0)
    assert fig.data[0].x[0].startswith("0 '‹|im_start|›'")  # < > would be read as HTML by plotly
    assert fig.data[0].y[-1].startswith(f"{short.n_fed - 1} ")


def test_step_chart_shows_every_head_of_the_layer(short, long_trace):
    fig = fa.step_chart(short, 5, 3, k=4)
    assert fig.data[0].z.shape[0] == short.model.q_heads
    # step 0 is the last prompt query: its row is the exact window row
    assert np.allclose(fa.step_row(short, 5, 0)[:, : short.n_prompt], short.window_rows[5, :, -1])
    assert np.allclose(fa.step_row(short, 5, 2), short.decode_rows[1, 5].astype(np.float32))
    assert _cells(fa.step_chart(long_trace, 5, 200)) <= 9 * fa.MAX_STEP_COLS
    with pytest.raises(ValueError, match="step"):
        fa.step_chart(short, 5, len(short.steps))


def test_sink_figures(short):
    m = short.model
    sink = fs.sink_map(short, 4)
    assert np.asarray(sink.data[0].z).shape == (m.layers, m.q_heads)
    assert len(sink.layout.shapes) == m.kv_heads - 1  # lines between KV groups
    line = fs.sink_line(short, 4)
    assert [t.name for t in line.data][-2:] == ["mean over heads", "uniform attention"]
    norms = fs.norms_chart(short, 4)
    assert len(norms.data) == 6  # token 0, tokens 1-3, others; keys and values


def test_token_strip_marks_sinks_and_elides_long_runs(short, long_trace):
    spans = fs.token_spans(short, 2)
    assert [label for _, label in spans[:2]] == ["sink", "sink"] and spans[2][1] != "sink"
    assert spans[-1][1] == "generated"
    assert sum(label == "most attended" for _, label in spans) == 5
    long = fs.token_spans(long_trace, 4)
    assert len(long) <= fs.STRIP_MAX + 1 and any(label is None for _, label in long)


@pytest.mark.parametrize(
    "call",
    [lambda t: fa.attention_heatmap(t, 30, 0), lambda t: fa.attention_heatmap(t, 0, 9), lambda t: fs.sink_map(t, 0)],
)
def test_bad_selection_is_refused(short, call):
    with pytest.raises(ValueError):
        call(short)


def test_every_view_has_a_one_sentence_caption():
    for captions, keys in (
        (fa.CAPTIONS, ("heatmap", "step")),
        (fs.CAPTIONS, ("sink_map", "sink_line", "norms", "tokens")),
    ):
        for key in keys:
            assert captions[key].strip().endswith(".")
        json.dumps(captions)
