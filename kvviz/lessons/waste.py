"""The chapter's waste arithmetic: token-forward passes with and without a KV cache."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ForwardPasses:
    """How many tokens go through the model to generate ``new_tokens`` after ``prompt_tokens``.

    ``with_cache``: the prompt once, then each generated token but the last (L + N − 1).
    ``without_cache``: step i re-runs all L + i tokens, Σ_{i=0}^{N−1} (L + i) = NL + N(N−1)/2.
    ``chapter_*``: the chapter's round forms, L + N and Σ_{t=L}^{L+N} t ≈ NL + N²/2.
    """

    prompt_tokens: int
    new_tokens: int

    @property
    def with_cache(self) -> int:
        return self.prompt_tokens + max(self.new_tokens - 1, 0)

    @property
    def without_cache(self) -> int:
        n, length = self.new_tokens, self.prompt_tokens
        return n * length + n * (n - 1) // 2

    @property
    def ratio(self) -> float:
        return self.without_cache / self.with_cache if self.with_cache else 0.0

    @property
    def chapter_with_cache(self) -> int:
        return self.prompt_tokens + self.new_tokens

    @property
    def chapter_without_cache(self) -> int:
        lo, hi = self.prompt_tokens, self.prompt_tokens + self.new_tokens
        return (hi * (hi + 1) - (lo - 1) * lo) // 2  # Σ_{t=L}^{L+N} t

    @property
    def chapter_extra(self) -> int:
        """The chapter's sum minus the exact count: its one extra term, a pass over all L + N tokens."""
        return self.chapter_without_cache - self.without_cache

    @property
    def chapter_ratio(self) -> float:
        return self.chapter_without_cache / self.chapter_with_cache


def forward_passes(prompt_tokens: int, new_tokens: int) -> ForwardPasses:
    if prompt_tokens < 0 or new_tokens < 0:
        raise ValueError("token counts cannot be negative")
    return ForwardPasses(int(prompt_tokens), int(new_tokens))
