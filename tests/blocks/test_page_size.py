"""Page size costs reuse: the room's prompts replayed at 8 / 16 / 32 / 64-token blocks."""

from __future__ import annotations

import pytest

from kvviz.blocks.page_size import replay, shareable
from kvviz.capture.model_io import encode_prompt
from kvviz.examples.room import room_requests


def test_a_shared_prefix_loses_its_partial_page():
    # 20 shared tokens, then each request its own: 16-token blocks reuse 16, 8-token blocks 16, 4-token 20
    base = list(range(20))
    prompts = [base + [100 + i, 200 + i, 300 + i] for i in range(3)]
    assert shareable(prompts) == [0, 20, 20]
    frame = replay(prompts, block_sizes=(4, 8, 16, 32)).set_index("block size (tokens)")
    reused = frame["reused tokens per request"] * 3
    assert list(reused) == [40, 32, 32, 0]
    assert list(frame["partial-page loss per request"] * 3) == [0, 8, 8, 40]
    assert frame.loc[4, "hit rate"] == pytest.approx(10 / 15)  # 5 blocks per request, the first request's all missed
    assert all(frame["recomputed tokens per request"] + frame["reused tokens per request"] == 23)


def test_the_room_loses_more_to_larger_pages(lm):
    prompts = [encode_prompt(lm, p, True) for p in room_requests()]
    frame = replay(prompts)
    lost = list(frame["partial-page loss per request"])
    assert lost == sorted(lost) and lost[-1] > lost[0]
    hit = list(frame["hit rate"])
    assert hit[0] > hit[-1]
    assert (frame["reused tokens per request"] <= frame["shareable tokens per request"]).all()


def test_replay_refuses_an_empty_room():
    with pytest.raises(ValueError):
        replay([])
