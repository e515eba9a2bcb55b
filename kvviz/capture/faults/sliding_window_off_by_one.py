"""A sliding window off by one: a full window holds W − 1 keys instead of W, so the oldest key the query
should still see is gone."""

from __future__ import annotations

from dataclasses import dataclass

from kvviz.capture.faults.base import Fault, sdpa


@dataclass(frozen=True)
class SlidingWindowOffByOne(Fault):
    name = "sliding_window_off_by_one"
    title = "sliding window off by one"
    source = (
        "the W vs W − 1 convention of sliding-window caches (transformers' DynamicSlidingWindowLayer stores "
        "W − 1 and attends with the new token, W in all); the chapter's window pitfall"
    )
    lesson = (
        "A query of a window-W layer sees W keys, itself included; a cache trimmed to W − 1 after the append "
        "drops the oldest visible key — trim before the append, or keep W."
    )
    shows = "the struck sliding layer's attention output jumps at the first step whose window is full"
    first = "attention output"

    def attend(self, module, query, key, value, scaling, window=None):
        if not window or query.shape[2] != 1 or key.shape[2] < window:
            return None
        return sdpa(query, key[:, :, -(window - 1) :], value[:, :, -(window - 1) :], scaling)
