"""Arguments shared by the model-running sub-commands (trace, evict)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path


def add_prompt_args(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text")
    src.add_argument("--prompt-file", type=Path, help="read the prompt from this UTF-8 file")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate (default 64)")
    p.add_argument("--model", default=None, help="bundled (default), a local folder, or a Hugging Face id")
    p.add_argument("--device", default=None, help="cpu, cuda, mps (default: best available)")
    p.add_argument("--dtype", default=None, help="float32, bfloat16, float16 (default: fp32 on CPU, bf16 on GPU)")
    add_placement_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")


def add_placement_args(p: argparse.ArgumentParser, env: Callable[[str], str | None] = lambda _: None) -> None:
    """Flags that dispatch a model bigger than one device with accelerate (defaults from ``env``)."""
    p.add_argument(
        "--device-map",
        default=env("KVVIZ_DEVICE_MAP"),
        help="auto, balanced or sequential: spread the model over the GPUs, the CPU and disk (accelerate)",
    )
    p.add_argument(
        "--max-memory",
        default=env("KVVIZ_MAX_MEMORY"),
        help="with --device-map: the most each device may hold, e.g. 0=20GiB,1=20GiB,cpu=60GiB",
    )
    p.add_argument(
        "--offload-folder",
        default=env("KVVIZ_OFFLOAD_FOLDER"),
        help="with --device-map: folder for the weights that fit on no device",
    )


def placement(args: argparse.Namespace) -> dict:
    """``load_model``'s placement keywords from the flags."""
    from kvviz.models import ModelLoadError, parse_max_memory

    if not args.device_map:
        if args.max_memory or args.offload_folder:
            raise ModelLoadError("--max-memory and --offload-folder need --device-map (e.g. --device-map auto).")
        return {}
    return {
        "device_map": args.device_map,
        "max_memory": parse_max_memory(args.max_memory),
        "offload_folder": args.offload_folder,
    }


def read_prompt(args: argparse.Namespace) -> str:
    if args.prompt_file is not None:
        try:
            return args.prompt_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"Cannot read prompt file {args.prompt_file}: {exc}") from exc
    return args.prompt


def load(args: argparse.Namespace):
    from kvviz.models import load_model

    return load_model(args.model, device=args.device, dtype=args.dtype, **placement(args))
