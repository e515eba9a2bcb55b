"""What a model's KV cache stores, layer by layer, read from its transformers config.

``cache_layout(source)`` accepts a config dict, a ``config.json`` path (or its folder), pasted JSON
text, a preset name, a loaded model's config object, or (with ``allow_hub=True``) a hub id, and
returns a :class:`CacheLayout`: one :class:`LayerSpec` per layer saying which vectors each token
leaves in that layer's cache, how many tokens the layer can hold, and any fixed-size state.

Every number is read the way the model reads it: ``head_dim`` from the config when stated (Qwen3,
Gemma-2 and gpt-oss state one that differs from ``hidden_size // num_attention_heads``), KV heads
from ``num_key_value_heads`` (or GPT-2 / GPTBigCode / Falcon naming), the per-layer pattern from
``layer_types`` or, where a released config omits it, the rule the model's config class applies.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kvviz import limits
from kvviz.limits import MAX_CONFIG_BYTES, check_list_length, config_int
from kvviz.memory.layer_rules import kv_sources, per_layer_shapes
from kvviz.safety import check_config_size, parse_config_json

PRESET_DIR = Path(__file__).resolve().parent / "presets"

# layer_types names (transformers' own) → the kind kvviz sizes
_LAYER_KINDS = {
    "full_attention": "full",
    "sliding_attention": "sliding",
    "chunked_attention": "chunked",
    "indexed_attention": "full",  # DeepSeek-V3.2's sparse attention: MLA plus the indexer's keys
    "linear_attention": "state",
    "conv": "state",
    "mamba": "state",
    "hybrid": "full+state",
    "hybrid_sliding": "sliding+state",
    "dummy": "none",
    "moe": "none",
    "mlp": "none",
}
# model types whose released config.json omits layer_types; transformers' config class derives them
_ALTERNATING = {"gemma2": 2, "gpt_oss": 2, "gemma3": 6, "gemma3_text": 6, "cohere2": 4}
_ALL_STATE = {"mamba", "mamba2", "falcon_mamba"}
_ALL_INDEXED = {"deepseek_v32", "mistral_large4_text"}  # DeepSeek sparse attention on every layer


@dataclass(frozen=True)
class LayerSpec:
    """One layer's cache: per token, ``vectors`` = ((length, count), ...) stored; at most ``window`` tokens.

    Attention layers store ``2 × kv_heads`` vectors of ``head_dim`` (keys and values); MLA layers
    store one latent of ``kv_lora_rank`` and one RoPE key of ``qk_rope_head_dim`` (no factor 2, no
    heads), and under DeepSeek sparse attention one indexer key of ``index_head_dim`` more; fixed-state
    layers store ``state_elements`` per sequence whatever the context. A layer that attends to an
    earlier layer's K/V (cross-layer sharing, ``kind == "shared"``) stores nothing: ``kv_source`` names
    the layer whose cache it reads.
    """

    index: int
    layer_type: str  # the transformers name ("full_attention", "sliding_attention", ...) or "mla"
    kind: str  # "full" | "sliding" | "chunked" | "mla" | "state" | "none" (or "full+state", ...)
    vectors: tuple[tuple[int, int], ...] = ()
    kv_heads: int = 0  # heads the per-token vectors split into under tensor parallelism (MLA: 1, shared)
    window: int | None = None
    state_elements: int = 0
    kv_source: int | None = None

    @property
    def elements_per_token(self) -> int:
        return sum(length * count for length, count in self.vectors)


@dataclass(frozen=True)
class CacheLayout:
    """A model's cache, layer by layer, plus the shape numbers and how each was read."""

    name: str
    model_type: str
    layers: tuple[LayerSpec, ...]
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    hidden_size: int
    num_parameters: int | None = None
    max_position_embeddings: int | None = None
    mla: dict | None = None  # kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim
    notes: tuple[str, ...] = ()

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def kinds(self) -> list[str]:
        return [layer.kind for layer in self.layers]

    @property
    def attention(self) -> str:
        """MHA, GQA, MQA or MLA: what the attention layers share."""
        if self.mla:
            return "MLA"
        if self.num_key_value_heads == 1 and self.num_attention_heads > 1:
            return "MQA"
        return "MHA" if self.num_key_value_heads == self.num_attention_heads else "GQA"

    @property
    def windows(self) -> set[int]:
        return {layer.window for layer in self.layers if layer.window}


# ---- finding a config --------------------------------------------------------------------------
def preset_names() -> list[str]:
    """The bundled model presets, e.g. ``['DeepSeek-V3', 'Llama-3-70B', ...]``."""
    return sorted(p.stem for p in (PRESET_DIR / "models").glob("*.json"))


def load_preset(name: str) -> dict:
    """A preset's config dict (case-insensitive; ``llama-3-70b`` finds ``Llama-3-70B``)."""
    key = name.strip().lower()
    for stem in preset_names():
        if stem.lower() == key:
            return json.loads((PRESET_DIR / "models" / f"{stem}.json").read_text())
    raise ValueError(f"Unknown preset {name!r}; choose one of: {', '.join(preset_names())}.")


def stated_weights_gb(name: str) -> float | None:
    """The weights figure a preset's source quotes (GB), so the page reproduces the source's arithmetic."""
    value = load_preset(name).get("_weights_gb")
    return None if value is None else float(value)


def head_dim_note(layout: CacheLayout) -> str | None:
    """Say so when a config states a head_dim other than hidden / heads: sizes computed from hidden / heads are off."""
    heads = layout.num_attention_heads
    if layout.mla or not heads or layout.hidden_size % heads or layout.head_dim == layout.hidden_size // heads:
        return None
    derived = layout.hidden_size // heads
    ratio = layout.head_dim / derived
    return (
        f"This config states head_dim = {layout.head_dim}, not hidden_size / heads = {layout.hidden_size:,} / "
        f"{heads} = {derived}: the cache follows the stated {layout.head_dim}, so it is {ratio:g}× what "
        f"hidden / heads would predict (sources that derive head_dim from hidden / heads quote {1 / ratio:g}× "
        "these sizes)."
    )


def _from_hub(repo_id: str) -> dict:
    try:
        from huggingface_hub import hf_hub_download
    except ImportError as exc:  # pragma: no cover - huggingface_hub ships with transformers
        raise ValueError("huggingface_hub is not installed, so hub ids cannot be read.") from exc
    try:
        path = hf_hub_download(repo_id, "config.json")
    except Exception as exc:
        raise ValueError(f"Could not fetch config.json of {repo_id!r} from the hub: {type(exc).__name__}.") from None
    return parse_config_json(Path(path).read_bytes(), where=f"config.json of {repo_id}")


def load_config(source, *, allow_hub: bool = False) -> dict:
    """A plain config dict from any of the sources the module docstring lists."""
    if isinstance(source, dict):
        return dict(source)
    if hasattr(source, "to_dict"):  # a transformers PretrainedConfig (e.g. a loaded model's)
        cfg = source.get_text_config(decoder=True) if hasattr(source, "get_text_config") else source
        return cfg.to_dict()
    if isinstance(source, Path) or (isinstance(source, str) and not source.lstrip().startswith(("{", "["))):
        text = str(source).strip()
        if not text:
            raise ValueError("No config given: pass a preset name, a config.json path or JSON text.")
        if isinstance(source, str) and text.lower() in {n.lower() for n in preset_names()}:
            return load_preset(text)
        path = Path(text).expanduser()
        if path.is_dir():
            path = path / "config.json"
        if path.is_file():
            check_config_size(path.stat().st_size, MAX_CONFIG_BYTES, str(path))
            return parse_config_json(path.read_bytes(), where=str(path))
        if allow_hub and text.count("/") == 1 and not path.suffix:
            return _from_hub(text)
        raise ValueError(f"{text!r} is neither a preset ({', '.join(preset_names())}) nor a config.json file.")
    if isinstance(source, str):
        return parse_config_json(source, where="The pasted config")
    raise ValueError(f"Cannot read a config from a {type(source).__name__}.")


# ---- reading the numbers -----------------------------------------------------------------------
def _first(cfg: dict, *names: str) -> int | None:
    """The first of ``names`` the config states, checked against its bound (see :mod:`kvviz.limits`)."""
    for name in names:
        if cfg.get(name) is not None:
            return config_int(cfg, name)
    return None


def _required(cfg: dict, *names: str) -> int:
    value = _first(cfg, *names)
    if value is None:
        raise ValueError(f"The config states none of {', '.join(names)}.")
    return value


def _text_config(cfg: dict) -> dict:
    """Multimodal configs keep the language model under ``text_config``."""
    if _first(cfg, "num_hidden_layers", "n_layer", "num_layers", "n_layers") is None:
        for key in ("text_config", "language_config", "llm_config"):
            if isinstance(cfg.get(key), dict):
                return {**cfg[key], "_name": cfg.get("_name"), "_num_parameters": cfg.get("_num_parameters")}
    return cfg


def _kv_heads(cfg: dict, q_heads: int, notes: list[str]) -> int:
    if cfg.get("num_key_value_heads") is not None:
        return _required(cfg, "num_key_value_heads")
    if cfg.get("new_decoder_architecture") and cfg.get("num_kv_heads") is not None:  # Falcon-40B/180B
        return _required(cfg, "num_kv_heads")
    if cfg.get("multi_query"):  # GPTBigCode, Falcon-7B
        notes.append("multi_query=true: one K/V head shared by every query head (MQA)")
        return 1
    value = _first(cfg, "num_kv_heads", "n_head_kv", "multi_query_group_num")
    if value is not None:
        return value
    notes.append("num_key_value_heads not stated: every query head has its own K/V head (MHA)")
    return q_heads


def _layer_types(cfg: dict, n_layers: int, model_type: str, notes: list[str]) -> list[str]:
    """transformers' ``layer_types``, derived the way the model's config class derives them."""
    types = cfg.get("layer_types")
    if types is not None:
        return [str(t)[:64] for t in check_list_length(types, "layer_types", n_layers)]
    if model_type in _ALL_STATE:
        return ["mamba"] * n_layers
    if model_type in _ALL_INDEXED:
        return ["indexed_attention"] * n_layers
    if model_type == "jamba":
        period, offset = config_int(cfg, "attn_layer_period", 8), config_int(cfg, "attn_layer_offset", 4)
        return ["full_attention" if i % period == offset else "mamba" for i in range(n_layers)]
    window = config_int(cfg, "sliding_window")
    if cfg.get("use_sliding_window") is False:
        window = None  # Qwen2/Qwen3 configs state a window they do not use
    if model_type in _ALTERNATING and window:
        every = config_int(cfg, "sliding_window_pattern") or _ALTERNATING[model_type]
        notes.append(
            f"{model_type}: layers i with (i+1) % {every} != 0 are sliding-window (window {window}), "
            "the others global, as transformers' config class derives them"
        )
        return ["sliding_attention" if (i + 1) % every else "full_attention" for i in range(n_layers)]
    if model_type in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe") and window:
        first = config_int(cfg, "max_window_layers", n_layers)
        return ["sliding_attention" if i >= first else "full_attention" for i in range(n_layers)]
    if window:
        return ["sliding_attention"] * n_layers
    if config_int(cfg, "attention_chunk_size"):  # Llama-4: RoPE layers are chunked, every 4th (NoPE) is global
        every = config_int(cfg, "no_rope_layer_interval") or 4
        flags = cfg.get("no_rope_layers") or [int((i + 1) % every != 0) for i in range(n_layers)]
        check_list_length(flags, "no_rope_layers", n_layers)
        return ["chunked_attention" if flag else "full_attention" for flag in flags]
    return ["full_attention"] * n_layers


def _state_elements(cfg: dict, model_type: str) -> int:
    """Elements of one layer's fixed state (conv + recurrent) per sequence."""
    if cfg.get("linear_num_value_heads") is not None:  # Qwen3-Next / Qwen3.5 gated DeltaNet
        nk, nv = _required(cfg, "linear_num_key_heads"), _required(cfg, "linear_num_value_heads")
        dk, dv = _required(cfg, "linear_key_head_dim"), _required(cfg, "linear_value_head_dim")
        conv = (2 * nk * dk + nv * dv) * config_int(cfg, "linear_conv_kernel_dim", 4)
        return conv + nv * dk * dv
    if model_type in ("mamba", "falcon_mamba"):
        inner = config_int(cfg, "intermediate_size") or config_int(cfg, "expand", 2) * _required(cfg, "hidden_size")
        return inner * config_int(cfg, "conv_kernel", 4) + inner * config_int(cfg, "state_size", 16)
    if model_type == "mamba2":
        inner = config_int(cfg, "expand", 2) * _required(cfg, "hidden_size")
        groups, n = config_int(cfg, "n_groups", 1), config_int(cfg, "state_size", 128)
        conv = (inner + 2 * groups * n) * config_int(cfg, "conv_kernel", 4)
        return conv + _required(cfg, "num_heads") * _required(cfg, "head_dim") * n
    if model_type == "jamba":
        inner = config_int(cfg, "mamba_expand", 2) * _required(cfg, "hidden_size")
        return inner * config_int(cfg, "mamba_d_conv", 4) + inner * config_int(cfg, "mamba_d_state", 16)
    raise ValueError(f"kvviz does not know the state size of the linear/state-space layers of {model_type!r}.")


def _attention_shape(cfg: dict, notes: list[str]) -> tuple[int, int, int, dict | None]:
    """(query heads, KV heads, head_dim, MLA dims or None), read the way the model reads them."""
    q_heads = _required(cfg, "num_attention_heads", "n_head", "num_heads", "n_heads")
    hidden = _first(cfg, "hidden_size", "n_embd", "d_model", "dim") or 0
    if cfg.get("kv_lora_rank") is not None:  # MLA: num_key_value_heads plays no part in the cache
        mla = {k: config_int(cfg, k, 0) for k in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")}
        notes.append(
            f"MLA: each token caches a {mla['kv_lora_rank']}-dim latent plus a "
            f"{mla['qk_rope_head_dim']}-dim RoPE key per layer (no factor 2, no heads)"
        )
        return q_heads, q_heads, mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"], mla
    kv_heads = _kv_heads(cfg, q_heads, notes)
    if q_heads % kv_heads:
        raise ValueError(f"num_attention_heads {q_heads} is not a multiple of num_key_value_heads {kv_heads}.")
    if cfg.get("head_dim") is not None:
        head_dim = _required(cfg, "head_dim")
        if hidden and head_dim * q_heads != hidden:
            notes.append(
                f"head_dim {head_dim} is stated in the config; hidden_size / heads would give "
                f"{hidden} / {q_heads} = {hidden / q_heads:g}"
            )
        return q_heads, kv_heads, head_dim, None
    if not hidden:
        raise ValueError("The config states neither head_dim nor hidden_size.")
    if hidden % q_heads:
        raise ValueError(f"hidden_size {hidden} is not divisible by {q_heads} heads and no head_dim is given.")
    notes.append(f"head_dim = hidden_size / num_attention_heads = {hidden} / {q_heads} = {hidden // q_heads}")
    return q_heads, kv_heads, hidden // q_heads, None


def _parameters(cfg: dict) -> int | None:
    value = cfg.get("_num_parameters")
    return None if value is None else limits.bounded_int(value, "_num_parameters", 1, limits.MAX_PARAMETERS)


def cache_layout(source, *, name: str | None = None, allow_hub: bool = False) -> CacheLayout:
    """The per-layer description of what the cache stores, from any config source."""
    cfg = _text_config(load_config(source, allow_hub=allow_hub))
    notes: list[str] = []
    model_type = str(cfg.get("model_type") or "unknown")[:64]
    n_layers = _required(cfg, "num_hidden_layers", "n_layer", "num_layers", "n_layers")
    types = _layer_types(cfg, n_layers, model_type, notes)
    unknown = [(i, t) for i, t in enumerate(types) if t not in _LAYER_KINDS]
    if unknown:
        raise ValueError(
            f"Layer {unknown[0][0]} has layer type {unknown[0][1]!r}, which kvviz cannot size "
            f"(known: {', '.join(sorted(_LAYER_KINDS))})."
        )
    kinds = [_LAYER_KINDS[t] for t in types]
    attends = [k not in ("state", "none") for k in kinds]
    q_heads, kv_heads, head_dim, mla = _attention_shape(cfg, notes) if any(attends) else (0, 0, 0, None)

    sources = kv_sources(cfg, types)
    per_layer = per_layer_shapes(cfg, types, model_type) if any(attends) and not mla else {}
    index_dim = config_int(cfg, "index_head_dim")
    layers = []
    for i, (layer_type, kind, attend) in enumerate(zip(types, kinds, attends)):
        window = None
        if kind.startswith(("sliding", "chunked")):
            key = "attention_chunk_size" if kind == "chunked" else "sliding_window"
            window = config_int(cfg, key)
            if window is None:
                raise ValueError(f"Layer {i} is {layer_type} but the config states no {key}.")
        state = _state_elements(cfg, model_type) if kind.endswith("state") else 0
        vectors: tuple[tuple[int, int], ...] = ()
        heads = 0
        if attend and mla:  # one shared latent + RoPE key: a single "head" that tensor parallelism cannot split
            if kind == "full":  # DSA layers keep their transformers name, indexed_attention
                layer_type, kind = ("mla" if layer_type == "full_attention" else layer_type), "mla"
            vectors, heads = ((mla["kv_lora_rank"], 1), (mla["qk_rope_head_dim"], 1)), 1
        elif attend:
            over = per_layer.get(i, {})
            heads = int(over.get("num_key_value_heads", kv_heads))
            vectors = ((int(over.get("head_dim", head_dim)), 2 * heads),)
        if attend and types[i] == "indexed_attention" and index_dim:  # one indexer key per token, one "head"
            vectors += ((index_dim, 1),)
        source = None
        if sources is not None and sources[i] != i:  # reads an earlier layer's K/V: stores nothing itself
            kind, vectors, heads, window, source = "shared", (), 0, None, sources[i]
        layers.append(LayerSpec(i, layer_type, kind, vectors, heads, window, state, source))
    if sources is not None:
        own = sum(1 for i, s in enumerate(sources) if s == i)
        notes.append(
            f"cross-layer KV sharing: {own} of {n_layers} layers store K/V, the other {n_layers - own} reuse an earlier layer's"
        )
    if index_dim and "indexed_attention" in types:
        notes.append(f"DeepSeek sparse attention: each token also caches a {index_dim}-dim indexer key per layer")

    hidden = _first(cfg, "hidden_size", "n_embd", "d_model", "dim")
    return CacheLayout(
        name=name or str(cfg.get("_name") or cfg.get("_name_or_path") or cfg.get("name_or_path") or model_type)[:120],
        model_type=model_type,
        layers=tuple(layers),
        num_attention_heads=q_heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        hidden_size=int(hidden or 0),
        num_parameters=_parameters(cfg),
        max_position_embeddings=_first(cfg, "max_position_embeddings", "n_positions", "max_seq_len"),
        mla=mla,
        notes=tuple(notes),
    )
