"""Per-layer rules a config states beside its layer types: who stores K/V, and per-layer head sizes.

Gemma-3n and Gemma-4 state ``num_kv_shared_layers``: the last that many layers compute no keys or values
of their own and attend to those of the last earlier layer of the same type (sliding or global), as
their config classes' ``kv_sharing_modes`` say; transformers gives such a layer a ``DummyLayer`` in the
cache, which stores nothing. Mistral-Large-4 states ``kv_source_layers``, one source index per layer.
``kv_sources`` returns, per layer, the index of the layer whose cache it reads (its own index when it
stores its own), or ``None`` when the config shares nothing; ``per_layer_shapes`` the layers whose head
size differs from the config's top-level one (Gemma-4's global layers). :mod:`kvviz.memory.layout`
reads configs with them::

    kv_sources({"num_kv_shared_layers": 2}, ["full_attention"] * 4)   # [0, 1, 1, 1]
"""

from __future__ import annotations

from collections.abc import Sequence

from kvviz.limits import bounded_int, check_list_length, config_int


def producers_from_count(types: Sequence[str | None], producing: int) -> list[int]:
    """Sources when only the first ``producing`` layers store K/V (Gemma's rule for the rest).

    Each later layer reads the last producing layer of its own type; a type with no producing
    layer cannot be shared, as Gemma-4's config class refuses it too. Layers typed ``None`` (no
    attention cache: linear-attention or state-space layers) keep what they have.
    """
    n = len(types)
    producing = bounded_int(producing, "KV-producing layers", 1, n)
    sources = list(range(n))
    last = {t: i for i, t in enumerate(types[:producing]) if t is not None}
    for i in range(producing, n):
        kind = types[i]
        if kind is None:
            continue
        if kind not in last:
            raise ValueError(
                f"Layer {i} is {types[i]}, but none of the first {producing} (KV-producing) layers is: "
                "a shared layer reads the last producing layer of its own type."
            )
        sources[i] = last[kind]
    return sources


def kv_sources(cfg: dict, types: list[str]) -> list[int] | None:
    """Per layer, the layer whose K/V it attends to (see the module docstring); ``None``: no sharing."""
    n = len(types)
    listed = cfg.get("kv_source_layers")
    if listed is not None:
        sources = [
            bounded_int(s, "kv_source_layers entry", 0, n - 1) for s in check_list_length(listed, "kv_source_layers", n)
        ]
        for i, s in enumerate(sources):
            if s > i or sources[s] != s:
                raise ValueError(
                    f"kv_source_layers: layer {i} must read an earlier layer that stores its own K/V, not {s}."
                )
        return sources if sources != list(range(n)) else None
    shared = cfg.get("num_kv_shared_layers")
    if shared in (None, 0):
        return None
    shared = bounded_int(shared, "config field 'num_kv_shared_layers'", 0, n)
    if shared == n:
        raise ValueError("num_kv_shared_layers equals the number of layers: no layer would produce K/V to share.")
    return producers_from_count(list(types), n - shared)


def per_layer_shapes(cfg: dict, types: list[str], model_type: str) -> dict[int, dict]:
    """Layers whose head_dim or KV heads differ from the config's top-level ones (Gemma-4's global layers).

    A config object's ``to_dict`` states them as ``per_layer_config``; a released Gemma-4 config.json as
    ``global_head_dim`` (default 512) and, with ``attention_k_eq_v``, ``num_global_key_value_heads``,
    applied to its full-attention layers as its config class applies them.
    """
    stated = cfg.get("per_layer_config")
    if isinstance(stated, dict):  # each override checked against the bound of the field it overrides
        return {
            int(k): {f: config_int(v, f) for f in ("head_dim", "num_key_value_heads") if v.get(f) is not None}
            for k, v in stated.items()
            if str(k).isdigit() and int(k) < len(types) and isinstance(v, dict)
        }
    if not model_type.startswith("gemma4"):
        return {}
    over: dict = {"head_dim": config_int(cfg, "global_head_dim", 512)}
    if cfg.get("attention_k_eq_v") and cfg.get("num_global_key_value_heads") is not None:
        over["num_key_value_heads"] = config_int(cfg, "num_global_key_value_heads")
    return {i: over for i, t in enumerate(types) if t == "full_attention"}
