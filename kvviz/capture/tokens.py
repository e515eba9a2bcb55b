"""Token ids → display strings, one per token, with multi-byte characters kept whole.

A byte-level tokenizer may split one character (an emoji, an accented letter) across tokens; decoding
each token alone gives "�". :class:`TokenTexts` holds such bytes back and shows the whole character on
the token that completes it (the tokens before it show ""), so chips never show replacement marks::

    texts = TokenTexts(tokenizer)
    [texts.push(i) for i in ids]
"""

from __future__ import annotations

from collections.abc import Iterable

REPLACEMENT = "\ufffd"
MAX_HELD = 4  # a UTF-8 character is at most 4 bytes, so at most 4 byte tokens wait for it


class TokenTexts:
    """Decode ids one at a time; a token that ends inside a character waits for the token that completes it."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.held: list[int] = []

    def push(self, token_id: int) -> str:
        """The text to show for this token: "" while a character is incomplete, the whole character when done."""
        self.held.append(int(token_id))
        text = self.tokenizer.decode(self.held)
        if text.endswith(REPLACEMENT) and len(self.held) < MAX_HELD:
            return ""
        self.held = []
        return text


def token_texts(tokenizer, ids: Iterable[int]) -> list[str]:
    """Display strings for a whole id sequence (see :class:`TokenTexts`)."""
    texts = TokenTexts(tokenizer)
    return [texts.push(i) for i in ids]
