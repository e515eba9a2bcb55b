"""The lecture-hall engine: many people's runs on one model, decoded together.

:mod:`kvviz.engine.engine` schedules runs (continuous batching over packed forwards, shared
identical requests); :mod:`kvviz.engine.prefix` reuses the KV of prompt prefixes the room shares.
Nothing here imports gradio: a notebook can drive an :class:`~kvviz.engine.engine.Engine` too.
"""
