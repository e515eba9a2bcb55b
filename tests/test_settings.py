"""kvviz.settings: limits and deployment switches from the environment."""

from __future__ import annotations

import pytest

from kvviz.settings import HUB_DEFAULT, Settings, default_concurrency

VARS = [
    "KVVIZ_MAX_PROMPT_TOKENS",
    "KVVIZ_MAX_PROMPT_CHARS",
    "KVVIZ_MAX_NEW_TOKENS",
    "KVVIZ_CONCURRENCY",
    "KVVIZ_QUEUE_SIZE",
    "KVVIZ_MAX_CONFIG_BYTES",
    "KVVIZ_SESSION_GRACE_S",
    "KVVIZ_FILE_MAX_AGE_S",
    "KVVIZ_PUBLIC",
    "KVVIZ_ALLOWED_MODELS",
    "KVVIZ_GATHER_MS",
    "KVVIZ_WARM",
    "KVVIZ_PRECOMPUTE",
    "KVVIZ_PREFIX_DISK_MB",
    "KVVIZ_CACHE_SALT",
    "SPACE_ID",
    "SPACES_ZERO_GPU",
]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in VARS:
        monkeypatch.delenv(name, raising=False)


def test_defaults_are_private_and_sized_for_the_machine(monkeypatch):
    s = Settings.from_env()
    assert (s.max_prompt_tokens, s.max_new_tokens, s.queue_size) == (8192, 512, 64)
    assert not s.public and s.allowed_models == []
    assert s.concurrency == default_concurrency() >= 1
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert default_concurrency() == 1  # this 2-core machine: one job at a time
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    assert default_concurrency() == 4
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    assert default_concurrency() == 2


def test_limits_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("KVVIZ_MAX_PROMPT_TOKENS", "1024")
    monkeypatch.setenv("KVVIZ_MAX_NEW_TOKENS", " 64 ")
    monkeypatch.setenv("KVVIZ_CONCURRENCY", "3")
    monkeypatch.setenv("KVVIZ_MAX_CONFIG_BYTES", "4096")
    monkeypatch.setenv("KVVIZ_SESSION_GRACE_S", "0")
    assert Settings.from_env().gather_ms == 100  # the served engine waits while a room's presses keep coming
    monkeypatch.setenv("KVVIZ_GATHER_MS", "500")
    assert Settings.from_env().gather_ms == 500
    monkeypatch.setenv("KVVIZ_GATHER_MS", "0")
    s = Settings.from_env()
    assert s.gather_ms == 0
    assert (s.max_prompt_tokens, s.max_new_tokens, s.concurrency, s.max_config_bytes, s.session_grace_s) == (
        1024,
        64,
        3,
        4096,
        0,
    )


@pytest.mark.parametrize(
    "name, raw, message",
    [
        ("KVVIZ_MAX_NEW_TOKENS", "lots", "must be an integer"),
        ("KVVIZ_CONCURRENCY", "0", "at least 1"),
        ("KVVIZ_MAX_PROMPT_TOKENS", "-1", "at least 1"),
        ("KVVIZ_MAX_CONFIG_BYTES", "10", "at least 1024"),
        ("KVVIZ_QUEUE_SIZE", "2.5", "must be an integer"),
        ("KVVIZ_GATHER_MS", "-5", "at least 0"),
    ],
)
def test_bad_environment_values_are_refused(monkeypatch, name, raw, message):
    monkeypatch.setenv(name, raw)
    with pytest.raises(ValueError, match=f"{name} must be"):
        Settings.from_env()
    with pytest.raises(ValueError, match=message):
        Settings.from_env()


def test_public_mode_and_its_default_allowlist(monkeypatch):
    monkeypatch.setenv("KVVIZ_PUBLIC", "1")
    assert Settings.from_env().allowed_models == [HUB_DEFAULT, "bundled"]
    monkeypatch.setenv("KVVIZ_ALLOWED_MODELS", " a/b , c/d ,, ")
    s = Settings.from_env()
    assert s.public and s.allowed_models == ["a/b", "c/d"]


def test_sessions_are_salted_in_public_mode_unless_turned_off(monkeypatch):
    assert not Settings.from_env().cache_salt  # a lecture room shares its system prompt's blocks on purpose
    monkeypatch.setenv("KVVIZ_CACHE_SALT", "1")
    assert Settings.from_env().cache_salt
    monkeypatch.delenv("KVVIZ_CACHE_SALT")
    monkeypatch.setenv("KVVIZ_PUBLIC", "1")
    assert Settings.from_env().cache_salt
    monkeypatch.setenv("KVVIZ_CACHE_SALT", "0")
    assert not Settings.from_env().cache_salt


def test_the_disk_tier_is_bounded(monkeypatch):
    assert Settings.from_env().prefix_disk_mb == 1024
    monkeypatch.setenv("KVVIZ_PREFIX_DISK_MB", "0")
    assert Settings.from_env().prefix_disk_mb == 0
    for raw, message in [("-1", "at least 0"), (str(2**21), "at most"), ("lots", "must be an integer")]:
        monkeypatch.setenv("KVVIZ_PREFIX_DISK_MB", raw)
        with pytest.raises(ValueError, match=message):
            Settings.from_env()


def test_a_space_is_public(monkeypatch):
    monkeypatch.setenv("SPACE_ID", "someone/kvviz")
    assert Settings.from_env().public


@pytest.mark.parametrize("raw, on", [(None, True), ("1", True), ("0", False), (" off ", False), ("no", False)])
def test_the_start_up_switches_are_on_unless_turned_off(monkeypatch, raw, on):
    for name in ("KVVIZ_WARM", "KVVIZ_PRECOMPUTE"):
        if raw is not None:
            monkeypatch.setenv(name, raw)
    s = Settings.from_env()
    assert s.warm is on and s.precompute is on


@pytest.mark.parametrize("raw", ["true", "1"])
def test_zerogpu_runs_no_model_work_at_start_up_unless_asked(monkeypatch, raw):
    """ZeroGPU's main process has no GPU: the warm-up and the show-me examples are off (no engine gathers by default)."""
    monkeypatch.setenv("SPACES_ZERO_GPU", raw)
    s = Settings.from_env()
    assert s.zero_gpu and not s.warm and not s.precompute and s.gather_ms == 0
    monkeypatch.setenv("KVVIZ_PRECOMPUTE", "1")
    assert Settings.from_env().precompute  # an explicit setting wins
    monkeypatch.setenv("SPACES_ZERO_GPU", "false")
    s = Settings.from_env()
    assert not s.zero_gpu and s.warm


def test_a_public_deployment_bounds_jobs_per_address_and_a_space_reads_its_proxy(monkeypatch):
    from kvviz.settings import PUBLIC_JOBS_PER_ADDRESS

    for name in ("KVVIZ_PUBLIC", "SPACE_ID", "KVVIZ_JOBS_PER_ADDRESS", "KVVIZ_PROXY_HOPS"):
        monkeypatch.delenv(name, raising=False)
    private = Settings.from_env()
    assert private.jobs_per_address == 0 and private.proxy_hops == 0
    monkeypatch.setenv("KVVIZ_PUBLIC", "1")
    assert Settings.from_env().jobs_per_address == PUBLIC_JOBS_PER_ADDRESS
    monkeypatch.setenv("SPACE_ID", "someone/kvviz")
    monkeypatch.setenv("KVVIZ_JOBS_PER_ADDRESS", "40")
    space = Settings.from_env()
    assert space.proxy_hops == 1 and space.jobs_per_address == 40
