"""Limits and deployment switches, read from the environment once at start-up.

Every limit is enforced before work starts, so a request that is too big is refused with a
message instead of tying up the shared model. Variables (all optional):

==========================  ===========================================================
KVVIZ_MAX_PROMPT_TOKENS     longest prompt, in tokens (8192)
KVVIZ_MAX_PROMPT_CHARS      longest prompt, in characters, checked before tokenizing (200000)
KVVIZ_MAX_NEW_TOKENS        most tokens one request may generate (512)
KVVIZ_CONCURRENCY           model jobs running at once (1 per 4 CPU cores, at least 1; 2 on a GPU)
KVVIZ_QUEUE_SIZE            jobs waiting beyond that before new ones are refused (64)
KVVIZ_ROOM_SIZE             Generate runs the engine follows at once, identical ones counted each (128)
KVVIZ_BATCH_SIZE            distinct runs the engine decodes together in one forward (32)
KVVIZ_PREFIX_CACHE_MB       bytes of shared prompt-prefix KV the engine keeps, in MiB (256)
KVVIZ_PREFIX_DISK_MB        bytes of prefix blocks evicted from memory kept on disk under KVVIZ_CACHE_DIR,
                            in MiB (1024; 0 = no disk tier; at most limits.MAX_PREFIX_DISK_MB)
KVVIZ_CACHE_SALT            1 = each session's prefix blocks hashed with its own salt: no session's time to
                            first token tells whether another sent the same prompt (on in public mode, off
                            elsewhere: a lecture room shares its system prompt's blocks on purpose)
KVVIZ_MAX_CONFIG_BYTES      largest uploaded or pasted config.json (262144)
KVVIZ_MAX_JOB_SECONDS       a model job running longer ends with what it has (180)
KVVIZ_MAX_RSS_GB            no new model jobs while the server's resident memory is above this
                            (75% of the machine's memory or the container's limit if smaller, or 12 where
                            that is unknown)
KVVIZ_MAX_KEY_READS         largest job, in attention key reads over all layers and runs
                            (four runs of the longest allowed prompt and generation: ~4e9 for SmolLM2)
KVVIZ_SESSION_GRACE_S       seconds a closed session's traces are kept for a reconnect (60)
KVVIZ_FILE_MAX_AGE_S        exported files older than this are deleted (3600)
KVVIZ_PUBLIC                1 = public deployment (also implied by SPACE_ID on a Hugging Face Space)
KVVIZ_ALLOWED_MODELS        comma-separated model ids a public deployment may load
KVVIZ_JOBS_PER_ADDRESS      model jobs one network address may have queued or running (public: 16; else
                            no bound): a script cannot fill the queue with one session per request
KVVIZ_KEY_READS_PER_S       attention key reads (all layers) the model does per second, to estimate a job's
                            model time: new jobs wait for none and are refused while the jobs queued or
                            running would take longer than KVVIZ_MAX_JOB_SECONDS (1e7 per CPU core; 1e9 on CUDA)
KVVIZ_PROXY_HOPS            proxies in front of the app that append the caller's address to
                            X-Forwarded-For (1 on a Space, else 0: the connection's peer is the caller)
KVVIZ_PRECOMPUTE            0 = do not compute the show-me examples in the background at start-up (1; 0 on
                            ZeroGPU, whose main process has no GPU to compute them with)
KVVIZ_WARM                  0 = do not run the Generate example once at start-up to fill the prefix cache (1; 0 on
                            ZeroGPU)
SPACES_ZERO_GPU             set by a ZeroGPU Space: every model job runs whole in its own spaces.GPU call (a
                            forked worker), so nothing runs the model at start-up or between calls
KVVIZ_MODEL                 the model to load when none is given (bundled; on a Space the hub copy)
KVVIZ_CACHE_DIR             folder for converted models (~/.cache/kvviz)
KVVIZ_RESULTS_DIR           folder for the show-me results a server stores for its next start
                            (<KVVIZ_CACHE_DIR>/results); 0 = keep them in memory only
KVVIZ_LEADERBOARD           the sweep result the Leaderboard tab shows (bench/results/leaderboard.json)
SPACE_ID                    set by Hugging Face Spaces: public mode, the hub copy of SmolLM2
KVVIZ_MCP                   1 = serve the named endpoints as MCP tools at /gradio_api/mcp (on by default
                            on a Hugging Face Space, where SPACE_ID is set; off elsewhere)
==========================  ===========================================================

``app.py``'s flags take their defaults from :func:`env` (KVVIZ_HOST, KVVIZ_PORT, …, listed there), so
every environment read of kvviz is in this module.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import overload

import torch

from kvviz.limits import MAX_CONFIG_BYTES, MAX_PREFIX_DISK_MB
from kvviz.process_memory import machine_memory

HUB_DEFAULT = "HuggingFaceTB/SmolLM2-135M-Instruct"  # what a Space serves: it has no bundled GGUF package


@overload
def env(name: str) -> str | None: ...


@overload
def env(name: str, default: str) -> str: ...


@overload
def env(name: str, default: str | None) -> str | None: ...


def env(name: str, default: str | None = None) -> str | None:
    """One variable as set, or ``default``: the reads that are not limits (app.py's flags, the model, paths)."""
    return os.environ.get(name, default)


def zero_gpu() -> bool:
    """Whether this runs on a ZeroGPU Space: its runtime sets ``SPACES_ZERO_GPU`` in the main process, where
    torch has no usable GPU and a model forward is only possible inside a ``spaces.GPU`` call."""
    return os.environ.get("SPACES_ZERO_GPU", "").strip().lower() not in {"", "0", "false", "no", "off"}


def on_space() -> bool:
    """Whether this runs on a Hugging Face Space (it sets ``SPACE_ID``)."""
    return bool(os.environ.get("SPACE_ID"))


def _int(name: str, default: int, minimum: int = 1) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from exc
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return value


def _float(name: str, default: float, minimum: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError as exc:
        raise ValueError(f"{name} must be a number, got {raw!r}") from exc
    if not value >= minimum or value == float("inf"):
        raise ValueError(f"{name} must be a finite number of at least {minimum:g}, got {raw!r}")
    return value


def _at_most(name: str, value: int, limit: int = MAX_PREFIX_DISK_MB) -> int:
    if value > limit:
        raise ValueError(f"{name} must be at most {limit:,}, got {value:,}")
    return value


def default_max_rss_gb() -> float:
    """Three quarters of the memory this process may have (the container's limit where there is one): room for
    the OS and for the jobs admitted just before the ceiling to reach their peaks (docs/deploy.md)."""
    total = machine_memory()
    return round(0.75 * total / 2**30, 1) if total else 12.0


# a lecture hall behind one NAT address (campus Wi-Fi) shares this bound: raise it for such a room
PUBLIC_JOBS_PER_ADDRESS = 16


def default_key_reads_per_s() -> float:
    """SmolLM2-135M's pace in key reads: six 7,680-token prompts on 2 cores (~1.2e10 key reads, their
    checks included) took ~535 s, ~2e7 a second, 1e7 per core; a GPU is two orders faster."""
    if torch.cuda.is_available():
        return 1e9
    return 1e7 * max(1, os.cpu_count() or 1)


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def _switch(name: str, default: bool) -> bool:
    """A switch that is ``default`` unless set: 1, true, yes or on turn it on, anything else off."""
    raw = os.environ.get(name, "").strip().lower()
    return default if raw == "" else raw in {"1", "true", "yes", "on"}


def default_concurrency() -> int:
    """Jobs at once: one per 4 CPU cores (torch already uses every core for one job), 2 with CUDA."""
    if torch.cuda.is_available():
        return 2
    return max(1, min(4, (os.cpu_count() or 1) // 4))


@dataclass
class Settings:
    """What one deployment allows. ``public`` turns on the allowlist and forbids local paths."""

    max_prompt_tokens: int = 8192
    max_prompt_chars: int = 200_000
    max_new_tokens: int = 512
    concurrency: int = 1
    queue_size: int = 64
    room_size: int = 128
    batch_size: int = 32
    prefix_cache_mb: int = 256
    prefix_disk_mb: int = 1024  # the prefix store's disk tier (0: none)
    cache_salt: bool = False  # per-session salts in the prefix store's block hashes (public mode's default)
    # an idle engine waits while a room's presses keep coming (each within this many ms of the last, 3× at most), so
    # the room starts in one step: starting on the first press, that one's lone step took the cores while the
    # others' requests were still being read (bench/load.py, interleaved: p95 5.43 → 5.19 s); a lone run waits this long
    gather_ms: int = 100
    public: bool = False
    allowed_models: list[str] = field(default_factory=list)
    jobs_per_address: int = 0  # 0: no bound (a private deployment); a public one defaults to PUBLIC_JOBS_PER_ADDRESS
    proxy_hops: int = 0
    key_reads_per_s: float = 2e7
    max_config_bytes: int = MAX_CONFIG_BYTES
    session_grace_s: int = 60
    file_max_age_s: int = 3600
    max_job_seconds: float = 180.0
    max_rss_gb: float = 12.0
    max_key_reads: int | None = None  # None: what max_prompt_tokens + max_new_tokens cost on the loaded model
    precompute: bool = True  # compute the planned examples in a background thread at start-up
    warm: bool = True  # run the Generate example once before serving (the engine's prefix cache, first forward)
    zero_gpu: bool = False  # a ZeroGPU Space (SPACES_ZERO_GPU): the model runs only inside spaces.GPU calls
    mcp: bool = False  # launch(mcp_server=...): the named endpoints as tools for an LLM client (Gradio's MCP server)
    results_dir: str | None = None  # stored show-me results, read back by the next start (None: memory only)

    @classmethod
    def from_env(cls) -> Settings:
        public = _flag("KVVIZ_PUBLIC") or on_space()
        zero = zero_gpu()
        allowed = [m.strip() for m in os.environ.get("KVVIZ_ALLOWED_MODELS", "").split(",") if m.strip()]
        if public and not allowed:
            allowed = [HUB_DEFAULT, "bundled"]
        return cls(
            max_prompt_tokens=_int("KVVIZ_MAX_PROMPT_TOKENS", cls.max_prompt_tokens),
            max_prompt_chars=_int("KVVIZ_MAX_PROMPT_CHARS", cls.max_prompt_chars),
            max_new_tokens=_int("KVVIZ_MAX_NEW_TOKENS", cls.max_new_tokens),
            concurrency=_int("KVVIZ_CONCURRENCY", default_concurrency()),
            queue_size=_int("KVVIZ_QUEUE_SIZE", cls.queue_size),
            room_size=_int("KVVIZ_ROOM_SIZE", cls.room_size, minimum=1),
            batch_size=_int("KVVIZ_BATCH_SIZE", cls.batch_size, minimum=1),
            prefix_cache_mb=_int("KVVIZ_PREFIX_CACHE_MB", cls.prefix_cache_mb, minimum=0),
            prefix_disk_mb=_at_most("KVVIZ_PREFIX_DISK_MB", _int("KVVIZ_PREFIX_DISK_MB", cls.prefix_disk_mb, 0)),
            cache_salt=_switch("KVVIZ_CACHE_SALT", public),
            gather_ms=_int("KVVIZ_GATHER_MS", 0 if zero else cls.gather_ms, minimum=0),  # ZeroGPU: no room gathers
            public=public,
            allowed_models=allowed,
            jobs_per_address=_int("KVVIZ_JOBS_PER_ADDRESS", PUBLIC_JOBS_PER_ADDRESS if public else 0, minimum=0),
            key_reads_per_s=_float("KVVIZ_KEY_READS_PER_S", default_key_reads_per_s(), 1.0),
            proxy_hops=_int("KVVIZ_PROXY_HOPS", 1 if os.environ.get("SPACE_ID") else 0, minimum=0),
            max_config_bytes=_int("KVVIZ_MAX_CONFIG_BYTES", cls.max_config_bytes, minimum=1024),
            session_grace_s=_int("KVVIZ_SESSION_GRACE_S", cls.session_grace_s, minimum=0),
            file_max_age_s=_int("KVVIZ_FILE_MAX_AGE_S", cls.file_max_age_s, minimum=60),
            max_job_seconds=_float("KVVIZ_MAX_JOB_SECONDS", cls.max_job_seconds, 1.0),
            max_rss_gb=_float("KVVIZ_MAX_RSS_GB", default_max_rss_gb(), 0.5),
            max_key_reads=_int("KVVIZ_MAX_KEY_READS", 0, minimum=0) or None,
            precompute=_switch("KVVIZ_PRECOMPUTE", not zero),
            warm=_switch("KVVIZ_WARM", not zero),
            zero_gpu=zero,
            mcp=_switch("KVVIZ_MCP", bool(os.environ.get("SPACE_ID"))),
            results_dir=results_dir(),
        )


def results_dir() -> str | None:
    """Where show-me results are stored for the next start: KVVIZ_RESULTS_DIR, else ``results`` beside the
    converted models (KVVIZ_CACHE_DIR, ~/.cache/kvviz); "0" or "off" keeps them in memory only."""
    folder = os.environ.get("KVVIZ_RESULTS_DIR", "").strip()
    if folder.lower() in ("0", "off", "false", "no"):
        return None
    if folder:
        return folder
    root = os.environ.get("KVVIZ_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "kvviz")
    return os.path.join(root, "results")
