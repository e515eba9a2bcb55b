"""The chapter's 1,000 + 1,000 example: ~1.5 million vs ~2,000 token-forward passes, a 750× waste."""

import pytest

from kvviz.lessons.waste import forward_passes


def test_chapter_example():
    fp = forward_passes(1000, 1000)
    assert fp.chapter_without_cache == 1_501_500  # Σ_{t=1000}^{2000} t ≈ 1.5 million
    assert fp.chapter_with_cache == 2000
    assert round(fp.chapter_ratio) == 751 and int(fp.chapter_ratio) == 750  # "a 750× waste"
    assert fp.without_cache == 1000 * 1000 + 1000 * 999 // 2
    assert fp.with_cache == 1999


def test_exact_count_matches_a_step_by_step_sum():
    for length, n in [(1, 1), (4, 4), (37, 8), (5, 0)]:
        fp = forward_passes(length, n)
        assert fp.without_cache == sum(length + i for i in range(n))


def test_negative_counts_are_rejected():
    with pytest.raises(ValueError):
        forward_passes(-1, 3)
