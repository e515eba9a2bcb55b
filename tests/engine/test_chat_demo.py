"""The stored two-turn chat behind Learn's chat-reuse show-me: the second turn reads exactly what the first kept,
through an engine of its own, and the result survives the show-me store's disk format."""

from __future__ import annotations

import pytest

from kvviz.demo_files import DemoFiles
from kvviz.engine.chat_demo import QUESTIONS, chat_demo

pytestmark = pytest.mark.slow


def test_the_second_turn_starts_from_what_the_first_kept(lm, tmp_path):
    demo = chat_demo(lm)
    one, two = demo.turns
    assert (one.user, two.user) == QUESTIONS
    assert one.report.reused == 0  # a fresh store: nothing to start from
    assert one.cached > one.report.prompt_tokens  # the first answer's blocks were kept too, not only its prompt's
    assert two.report.diverged is None and two.report.reused == one.cached  # exactly those, read back
    assert two.report.computed == two.report.prompt_tokens - one.cached > 0
    assert "Paris" in one.answer and "Rome" in two.answer

    files = DemoFiles(tmp_path, lm.name, "test")
    files.save(("chat demo",), demo)
    assert files.load(("chat demo",))[0] == demo  # a restarted server's show-me shows the same turns
