"""Cache-vs-no-cache figures: no raw LaTeX on the page, titles short enough not to be cut."""

from __future__ import annotations

import re

from kvviz.figures import nocache as fig
from kvviz.lessons.nocache import CacheComparison, Run


def test_chapter_text_has_no_raw_latex():
    text = fig.chapter_text()
    assert "_{" not in text and "^{" not in text and "1,000 + 1,001 + … + 2,000 = **1,501,500**" in text


def test_time_title_lines_fit_a_narrow_chart():
    cached = Run(True, [1, 2, 3], [0.5, 0.1, 0.1], [300, 1, 1])
    uncached = Run(False, [1, 2, 3], [0.5, 0.6, 0.7], [300, 301, 302])
    title = fig.time_vs_n(CacheComparison(300, 3, cached, uncached)).layout.title.text
    lines = [re.sub("<[^>]+>", "", line) for line in title.split("<br>")]
    assert max(map(len, lines)) <= 50 and "2.6× slower without the cache at N = 3" in lines[1]
