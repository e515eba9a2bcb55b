"""Token display strings: a character split across byte tokens shows whole on the token that completes it."""

from __future__ import annotations

from kvviz.capture.tokens import token_texts


def test_split_characters_show_whole(lm):
    tok = lm.tokenizer
    text = "日本語の文章 🦩"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert any("\ufffd" in tok.decode([i]) for i in ids)  # the tokenizer does split a character
    shown = token_texts(tok, ids)
    assert len(shown) == len(ids) and not any("\ufffd" in s for s in shown)
    assert "".join(shown) == tok.decode(ids)
    assert shown[:3] == ["", "日", "本"] and shown[-1] == " 🦩" and shown[-2] == ""


def test_plain_tokens_are_unchanged(lm):
    ids = lm.tokenizer("Once upon a time", add_special_tokens=False)["input_ids"]
    assert token_texts(lm.tokenizer, ids) == [lm.tokenizer.decode([i]) for i in ids]
