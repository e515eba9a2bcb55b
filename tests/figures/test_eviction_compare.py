"""The Eviction view's side-by-side figures: the comparison table and charts, the sinks demo's curve."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kvviz.capture.model_io import encode_prompt
from kvviz.eviction.compare import compare
from kvviz.eviction.demos import SinksResult
from kvviz.eviction.policies import make_policy
from kvviz.figures import eviction_compare as fig

PROMPT = "The cat sat on the mat. Where did the cat sit?"


@pytest.fixture(scope="module")
def ids(lm):
    return encode_prompt(lm, PROMPT, True)


@pytest.mark.slow  # a real comparison run
def test_comparison_table_and_charts(lm, ids):
    cmp = compare(lm, ids, [make_policy("window")], budget=8, max_new_tokens=3)
    table = fig.comparison_table(cmp)
    assert table["policy"].tolist() == ["Full cache (no eviction)", "Sliding window (no sinks)"]
    assert table["cache"].tolist()[1] == "360 KiB"  # 8 entries × 2 × 30 layers × 3 KV heads × 64 × 4 bytes
    assert fig.bytes_figure(cmp).layout.xaxis.title.text == "cache size (MiB)"
    assert len(fig.kl_figure(cmp).data) == 1


def test_sinks_figure_uses_a_log_axis():
    frame = pd.DataFrame({"position": np.arange(1, 11), "a": np.full(10, 2.0), "b": np.full(10, 3.0)})
    f = fig.sinks_figure(SinksResult(frame, {"a": 7.4, "b": 20.1}, 4, 4), smooth=2)
    assert f.layout.yaxis.type == "log" and len(f.data) == 2
    assert np.allclose(f.data[0].y, np.exp(2.0))


def test_every_view_has_a_caption():
    for key in ("comparison", "bytes", "kl", "compose", "sinks"):
        assert fig.CAPTIONS[key].endswith(".")
