"""The new token's keys and values never reach the cache: the step attends to the stale cache, and the
position stays missing for every later step."""

from __future__ import annotations

from dataclasses import dataclass

from kvviz.capture.faults.base import Fault


@dataclass(frozen=True)
class NotAppended(Fault):
    name = "not_appended"
    title = "forget to append"
    source = "the chapter's KVCache.append (the step the cache grows by one); a classic of hand-written decode loops"
    lesson = (
        "Attending before (or without) appending the new token's K/V leaves the query blind to itself and the "
        "cache one entry short from then on; append, then attend over the grown cache."
    )
    shows = "the struck layer's cache is one entry short at the struck step (cache length), its output jumps"
    first = "cache length"
    once = True

    def store(self, keys, values, layer):
        return None
