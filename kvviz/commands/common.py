"""Arguments shared by the model-running sub-commands (trace, evict)."""

from __future__ import annotations

import argparse
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
    p.add_argument("--json", action="store_true", help="print one JSON object")


def read_prompt(args: argparse.Namespace) -> str:
    if args.prompt_file is not None:
        try:
            return args.prompt_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"Cannot read prompt file {args.prompt_file}: {exc}") from exc
    return args.prompt


def load(args: argparse.Namespace):
    from kvviz.models import load_model

    return load_model(args.model, device=args.device, dtype=args.dtype)
