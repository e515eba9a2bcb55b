"""``scaled``: presentation mode enlarges every text of a figure through its plotly layout, absolutely."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import pytest

from kvviz.figures.scale import PRESENT_SCALE, scale_of, scaled


def sample() -> go.Figure:
    fig = go.Figure(
        go.Heatmap(
            z=np.eye(3),
            text=[["1", "2", "3"]] * 3,
            texttemplate="%{text}",
            textfont=dict(size=9),
            colorbar=dict(title="share"),
        )
    )
    fig.add_annotation(text="note", x=0, y=0, font=dict(size=10))
    fig.update_layout(
        title="Sink map", height=300, margin=dict(l=50, r=20, t=50, b=40), legend=dict(font=dict(size=10))
    )
    return fig


def test_scaling_enlarges_layout_fonts_cells_annotations_and_margins():
    big = scaled(sample(), 2.0)
    assert big.layout.font.size == 24  # ticks, axis titles and legends follow the layout font
    assert big.layout.title.font.size == pytest.approx(17 * 1.5)  # titles grow less: they must fit across the chart
    assert big.data[0].textfont.size == 18  # sink-map cell numbers
    assert big.layout.annotations[0].font.size == 20
    assert big.layout.legend.font.size == 20
    assert big.layout.margin.t == 100 and big.layout.margin.l == 100
    assert big.layout.height > 300
    assert scale_of(big) == 2.0


def test_scaling_is_absolute_and_reversible_and_pure():
    fig = sample()
    once = scaled(fig, PRESENT_SCALE)
    twice = scaled(once, PRESENT_SCALE)
    assert twice.to_plotly_json() == once.to_plotly_json()
    back = scaled(once, 1.0)
    assert back.data[0].textfont.size == pytest.approx(9)
    assert back.layout.annotations[0].font.size == pytest.approx(10)
    assert back.layout.margin.t == 50 and back.layout.height == 300
    assert fig.layout.font.size is None and fig.data[0].textfont.size == 9  # the input is never changed
    assert scaled(fig, 1.0).to_plotly_json() == fig.to_plotly_json()


def test_scaling_rejects_nonsense_factors():
    with pytest.raises(ValueError):
        scaled(sample(), 0)
