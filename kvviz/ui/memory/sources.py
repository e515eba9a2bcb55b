"""Where the Memory tab's config comes from: a preset, the loaded model, pasted JSON or an uploaded file,
each checked (size, JSON, a known preset) before it becomes a :class:`~kvviz.memory.layout.CacheLayout`."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from kvviz.memory.layout import CacheLayout, cache_layout, load_preset, preset_names
from kvviz.safety import check_config_size, parse_config_json
from kvviz.ui.serving.context import AppContext
from kvviz.ui.serving.jobs import UserError
from kvviz.ui.serving.sessions import user_errors

SOURCES = ["Preset", "Loaded model", "Paste JSON", "Upload config.json"]


def _config_text(text: str, limit: int) -> dict:
    if text is None or not str(text).strip():
        raise UserError("Paste the model's config.json (a JSON object) or pick a preset.")
    with user_errors():
        return parse_config_json(str(text), limit, where="The pasted config")


def _upload(path, limit: int) -> dict:
    if not path:
        raise UserError("Upload a config.json file first.")
    p = Path(path)
    if p.suffix.lower() != ".json":
        raise UserError("Upload a .json file (the model's config.json).")
    with user_errors():
        check_config_size(p.stat().st_size, limit, "The file")
        return parse_config_json(p.read_bytes(), limit, where="The file")


def loaded_layout(ctx: AppContext) -> CacheLayout:
    """The loaded model's cache layout, with its real name and parameter count."""
    return replace(cache_layout(ctx.lm.config), name=ctx.info.name, num_parameters=ctx.info.param_count)


def resolve_layout(ctx: AppContext, source: str, preset: str, pasted: str, upload) -> CacheLayout:
    """The layout for the chosen source (never a path or hub id typed by a user)."""
    limit = ctx.settings.max_config_bytes
    with user_errors():
        if source == "Loaded model":
            return loaded_layout(ctx)
        if source == "Paste JSON":
            return cache_layout(_config_text(pasted, limit))
        if source == "Upload config.json":
            return cache_layout(_upload(upload, limit))
        if preset not in preset_names():
            raise UserError(f"Unknown preset {preset!r}; choose one of {', '.join(preset_names())}.")
        return cache_layout(load_preset(preset))
