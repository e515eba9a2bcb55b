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


def test_passes_name_the_term_that_dominates_and_show_the_chapters_750x():
    """L = 306, N = 24 (the show-me's run): N·L is 96 % of the no-cache passes, so the chart must not call it a
    parabola; the chapter's 1,000 + 1,000 sits beside it, where N²/2 is a third of the work."""
    length, n = 306, 24
    cached = Run(True, list(range(n)), [0.1] * n, [length] + [1] * (n - 1))
    uncached = Run(False, list(range(n)), [0.1] * n, [length + i for i in range(n)])
    f = fig.passes_vs_n(CacheComparison(length, n, cached, uncached))
    traces = {t.name: t for t in f.data}
    assert fig.quadratic_share(length, n) == 276 / 7620 and fig.quadratic_share(1000, 1000) > 0.33
    assert "quadratic" not in f.layout.title.text and "parabola" not in fig.CAPTIONS["passes"]
    assert f.layout.title.text.startswith("Passes: N·L dominates (L = 306 ≫ N = 24)") and "4%" in f.layout.title.text
    assert list(traces["N·L alone"].y) == [306 * k for k in range(1, n + 1)]
    assert list(traces["without cache (counted)"].y)[-1] == 7620 == list(traces["NL + N(N−1)/2"].y)[-1]
    chapter = traces["chapter: Σ t (without cache)"]
    assert (chapter.x[-1], chapter.y[-1], traces["chapter: L + N (with cache)"].y[-1]) == (1000, 1_501_500, 2000)
    assert "1,501,500 vs 2,000: 750×" in [a.text for a in f.layout.annotations]
    short = Run(True, [0] * 16, [0.1] * 16, [4] + [1] * 15), Run(False, [0] * 16, [0.1] * 16, list(range(4, 20)))
    long = fig.passes_vs_n(CacheComparison(4, 16, *short))
    assert "quadratic without" in long.layout.title.text  # N ≫ L: the N²/2 term does dominate
