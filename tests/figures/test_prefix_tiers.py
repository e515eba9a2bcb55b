"""Figures of the Blocks tab's reuse sections: the per-request sources bar and the page-size chart."""

from __future__ import annotations

from kvviz.blocks.page_size import replay
from kvviz.engine.prefix import RequestSources
from kvviz.figures.prefix_tiers import page_size_chart, page_size_table, sources_bar


def test_the_sources_bar_stacks_each_requests_tokens_by_tier():
    fig = sources_bar([RequestSources(1, 30, 0, 0), RequestSources(2, 8, 16, 8)])
    assert fig.layout.barmode == "stack" and [t.name for t in fig.data] == ["computed", "memory hit", "disk hit"]
    assert [list(t.y) for t in fig.data] == [[30, 8], [0, 16], [0, 8]] and list(fig.data[0].x) == ["#1", "#2"]
    assert "yet" in sources_bar([]).layout.title.text


def test_the_page_size_chart_shows_the_loss_and_the_hit_rate():
    base = list(range(20))
    frame = replay([base + [100 + i, 200 + i] for i in range(3)], block_sizes=(4, 16))
    fig = page_size_chart(frame)
    assert [t.name for t in fig.data][:2] == ["reused", "shared but recomputed"]
    assert list(fig.data[1].y) == list(frame["partial-page loss per request"])
    table = page_size_table(frame)
    assert table["hit rate"].iloc[0].endswith("%")
