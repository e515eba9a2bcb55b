"""The per-step charts share one frame: Generate's cache growth and the debugger's map read steps alike."""

from __future__ import annotations

import numpy as np

from kvviz.capture.divergence import Report
from kvviz.figures.debugger import divergence_map
from kvviz.figures.layout import MARGIN, STEP_AXIS


def test_the_divergence_map_uses_the_shared_step_frame():
    ratio = np.full((3, 2), 0.5)
    report = Report("float32", 3e-4, 4, ["a", "b", "c"], [1, 2, 3], [1, 2, 3], ratio, np.zeros(3), None, None)
    fig = divergence_map(report)
    assert fig.layout.xaxis.title.text == STEP_AXIS and fig.layout.xaxis.tickformat == "d"
    assert fig.layout.margin.l == MARGIN["l"] and fig.layout.margin.t == MARGIN["t"]
