"""Ready prompts for the app, the CLI and the tests: a chat question, a passage with one fact, the chapter."""

from __future__ import annotations

from pathlib import Path

ASSETS = Path(__file__).resolve().parent

CHAT_QUESTION = "What is the capital of France?"

_FILLER = [
    "The museum opened its new wing in the spring, and visitors came from all over the region to see it.",
    "Most of the paintings in the east gallery were donated by local families over many decades.",
    "A small cafe near the entrance serves tea, coffee and pastries to tired visitors every afternoon.",
    "The guided tours start every hour and last about forty minutes, covering the main halls.",
    "In the basement there is a workshop where restorers repair old frames and damaged canvases.",
    "School groups often visit on weekdays, and the staff prepare special activities for children.",
    "The garden behind the building has benches, a fountain and a row of tall old trees.",
    "Each winter the museum hosts a lecture series about art history and the lives of the painters.",
]
NEEDLE = "The secret code for the storage room is 4721."
NEEDLE_ANSWER = "4721"
NEEDLE_QUESTION = "What is the secret code for the storage room?"


def needle_passage(filler_before: int = 8, filler_after: int = 8) -> str:
    """A passage with one fact in the middle (the needle), for recall and eviction demos."""
    before = [_FILLER[i % len(_FILLER)] for i in range(filler_before)]
    after = [_FILLER[(i + 3) % len(_FILLER)] for i in range(filler_after)]
    return " ".join([*before, NEEDLE, *after])


def needle_prompt(filler_before: int = 8, filler_after: int = 8) -> str:
    """The passage followed by the question about the needle."""
    return f"{needle_passage(filler_before, filler_after)}\n\nQuestion: {NEEDLE_QUESTION}"


def chapter_text() -> str:
    """The source chapter "3.2 The KV Cache" (shipped beside this module)."""
    return (ASSETS / "chapter_kv_cache.txt").read_text(encoding="utf-8")


GENERATE_EXAMPLE = "Chat question"  # the Generate tab's example when the page opens


def examples() -> dict[str, tuple[str, bool]]:
    """Name → (prompt, use chat template)."""
    return {
        "Chat question": (CHAT_QUESTION, True),
        "Recall a fact from a passage": (needle_prompt(), True),
        "Story opening (plain text)": ("Once upon a time", False),
        "The source chapter (long)": (chapter_text(), False),
    }
