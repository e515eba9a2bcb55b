"""Limits and deployment switches, read from the environment once at start-up.

Every limit is enforced before work starts, so a request that is too big is refused with a
message instead of tying up the shared model.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field


def _int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from exc


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


@dataclass
class Settings:
    """What one deployment allows. ``public`` turns on the allowlist and forbids local paths."""

    max_prompt_tokens: int = 8192
    max_new_tokens: int = 512
    concurrency: int = 1
    queue_size: int = 64
    public: bool = False
    allowed_models: list[str] = field(default_factory=list)
    max_config_bytes: int = 256 * 1024

    @classmethod
    def from_env(cls) -> Settings:
        allowed = [m.strip() for m in os.environ.get("KVVIZ_ALLOWED_MODELS", "").split(",") if m.strip()]
        return cls(
            max_prompt_tokens=_int("KVVIZ_MAX_PROMPT_TOKENS", cls.max_prompt_tokens),
            max_new_tokens=_int("KVVIZ_MAX_NEW_TOKENS", cls.max_new_tokens),
            concurrency=_int("KVVIZ_CONCURRENCY", cls.concurrency),
            queue_size=_int("KVVIZ_QUEUE_SIZE", cls.queue_size),
            public=_flag("KVVIZ_PUBLIC") or bool(os.environ.get("SPACE_ID")),
            allowed_models=allowed,
        )
