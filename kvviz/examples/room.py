"""A lecture room's requests: each student's own one-line question per wave, and the example all of them press.

The load bench (``bench/load.py``) sends them to a served app; the Blocks tab and ``bench/page_sizes.py``
replay them through a prefix store at several block sizes, so the cost of a page size is measured on the
traffic kvviz was built for.
"""

from __future__ import annotations

SUBJECTS = [
    "the sea",
    "a red fox",
    "winter",
    "an old clock",
    "the moon",
    "bread",
    "a quiet library",
    "rain",
    "a mountain",
    "coffee",
    "a lost key",
    "the desert",
    "a violin",
    "autumn leaves",
    "a robot",
    "fire",
    "a small boat",
    "the city at night",
    "snow",
    "a garden",
    "an owl",
    "thunder",
    "a train",
    "honey",
    "a lighthouse",
    "the wind",
    "a cat",
    "summer",
    "a bridge",
    "stars",
    "a river",
    "a candle",
]
WAVE_ASKS = ["Write one sentence about {}.", "Describe {} in a few words.", "What do you think of {}?"]
SAME_EXAMPLE = "What is a KV cache? Answer in one sentence."  # the example the whole room presses


def prompt_for(i: int, wave: int = 0) -> str:
    """Student i's own one-line question in wave ``wave`` (distinct within and across waves, so no wave is
    answered from runs the server kept from an earlier one)."""
    ask = WAVE_ASKS[wave % len(WAVE_ASKS)]
    return ask.format(SUBJECTS[i % len(SUBJECTS)]) + " " * (wave // len(WAVE_ASKS))


def room_requests(students: int = 24, waves: int = 3) -> list[str]:
    """The room's distinct requests in the order they reach the engine: the example everyone presses (one
    run: the engine shares identical requests), then each wave's own questions."""
    return [SAME_EXAMPLE, *(prompt_for(i, wave) for wave in range(waves) for i in range(students))]
