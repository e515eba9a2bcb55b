"""What a shared prefix cache leaks: a second session's time to first token says whether someone sent a prefix.

A prefix store shared by every session answers a prompt whose leading blocks someone already sent
without computing them, so that request's first token comes much sooner. A second session that guesses
another's prompt (a document, a system prompt, a question) sends it and times the answer: a fast answer
means someone sent it. vLLM closes this with ``cache_salt``, kvviz with per-session salts in the block
hash (:class:`~kvviz.engine.prefix.PrefixStore`'s ``session_salt``, ``KVVIZ_CACHE_SALT``): a session then
reuses only its own blocks, and both cases take the prefill's time.

:func:`measure` shows it on a real model, in a store of its own (the server's stays as it is): per try, a
first session sends a prompt; a second sends the same prompt (the "already sent" case) and one nobody sent
(the "new" case), each timed from its look-up in the store to its first token; once with a shared store,
once with a salted one. The second session's guess: "someone sent it" when its answer came in under the
midpoint between what a hit takes (the shared store's hits: a session can time hits on its own prompts in
either store) and what a new prompt takes in that store.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from kvviz.capture.drive import forwards
from kvviz.capture.generation import Generation
from kvviz.capture.options import Decode, Feed, Recording
from kvviz.engine.prefix import SERVER, PrefixStore
from kvviz.models import LoadedModel

STORE_BYTES = 256 * 2**20  # every try's prompts fit: none is evicted


@dataclass(frozen=True)
class Leak:
    """Seconds to first token per try, by store (``salted``) and case (``hit``: the prefix was sent before)."""

    prompt_tokens: int
    tries: int
    times: dict[str, list[float]] = field(default_factory=dict)

    @staticmethod
    def key(salted: bool, hit: bool) -> str:
        return f"{'salted' if salted else 'shared'}-{'sent' if hit else 'new'}"

    def seconds(self, salted: bool, hit: bool) -> list[float]:
        return self.times.get(self.key(salted, hit), [])

    def median(self, salted: bool, hit: bool) -> float:
        return statistics.median(self.seconds(salted, hit))

    def guessed_right(self, salted: bool) -> float:
        """Share of the second session's requests it classifies rightly by their time alone (0.5: a coin), with
        the cut between a hit's time and a new prompt's (see the module docstring)."""
        cut = (self.median(False, True) + self.median(salted, False)) / 2
        right = sum(t < cut for t in self.seconds(salted, True)) + sum(t >= cut for t in self.seconds(salted, False))
        return right / (2 * self.tries)


def first_token_s(lm: LoadedModel, store: PrefixStore, ids: list[int], owner: str | None = SERVER) -> float:
    """One request of one new token through ``store`` as ``owner``: claim its cached blocks, prefill the rest, store
    them; the seconds from its look-up to its first token (the side channel's signal; the disk demo's way of
    filling the store)."""
    g = Generation(
        lm,
        "",
        feed=Feed(prompt_ids=ids, chat=False, prefill_chunk=0),
        decode=Decode(max_new_tokens=1),
        recording=Recording(on=False),
    )
    with torch.inference_mode():
        t0 = time.perf_counter()
        claim = store.claim(g, owners=[owner])
        for _ in forwards(lm, g, wrapped=False):
            break
        seconds = time.perf_counter() - t0
        store.store(g, claim, owners=[owner])
        store.release(claim)
    g.finish()
    g.release()
    return seconds


def measure(
    lm: LoadedModel, ids: list[int], tries: int = 3, progress: Callable[[float, str], None] | None = None
) -> Leak:
    """Time the second session's requests (see the module docstring) on prompts cut from ``ids``: try ``i``'s
    prompt starts at token ``2 i``, the prompt nobody sent one token later; all ``len(ids) - 2 · tries``
    tokens long."""
    n = len(ids) - 2 * tries
    if tries < 1 or n < 2 * PrefixStore(0).block_size:
        raise ValueError("measure needs at least one try and prompts of at least two blocks.")
    times: dict[str, list[float]] = {}
    done, total = 0, 2 * tries
    for salted in (False, True):
        store = PrefixStore(STORE_BYTES, salt=f"{lm.name}:{lm.dtype}", session_salt=salted)
        first_token_s(lm, store, ids[-n:], "warm-up")  # the first forward's allocations, outside the timing
        for i in range(tries):
            sent, new = ids[2 * i : 2 * i + n], ids[2 * i + 1 : 2 * i + 1 + n]
            first_token_s(lm, store, sent, "first")
            times.setdefault(Leak.key(salted, True), []).append(first_token_s(lm, store, sent, "second"))
            times.setdefault(Leak.key(salted, False), []).append(first_token_s(lm, store, new, "second"))
            done += 1
            if progress is not None:
                progress(done / total, f"{'salted' if salted else 'shared'} store: try {i + 1} of {tries}")
    return Leak(n, tries, times)
