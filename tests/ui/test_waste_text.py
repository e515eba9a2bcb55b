"""The Generate tab's waste counter: the exact count, the chapter's sum, and the gap between them."""

from __future__ import annotations

from types import SimpleNamespace

from kvviz.ui.generate.stream import waste_text
from kvviz.units import plural


def test_one_token_says_why_there_is_no_waste():
    text = waste_text(SimpleNamespace(n_prompt=18, n_generated=1))
    assert "with the cache **18**" in text and "without it **18**" in text and "**1.0×**" in text
    assert "nothing to re-run yet" in text and "18 prompt + 1 generated token)" in text
    assert "37 = 18 + 19" in text  # the chapter's sum has one more term: a pass over all 18 + 1 tokens


def test_the_gap_is_the_chapters_extra_term():
    text = waste_text(SimpleNamespace(n_prompt=18, n_generated=16))
    assert "without it **408**" in text and "16 generated tokens" in text
    assert "= 408 + 34" in text and "nothing to re-run" not in text
    assert "Σ_" not in text and "^{" not in text


def test_plural():
    assert plural(1, "token") == "1 token" and plural(2, "token") == "2 tokens" and plural(0, "token") == "0 tokens"
