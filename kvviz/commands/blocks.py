"""``python -m kvviz blocks``: the real cache of each prompt in fixed-size blocks, prefix sharing, eviction × paging.

    python -m kvviz blocks --prompt-file a.txt --prompt-file b.txt --chat --block-size 16 --json
    python -m kvviz blocks --prompt "…" --block-size 8 --policy h2o --budget 32 --json

Each prompt is prefilled on its own (block counts and bytes come from its cache tensors); the
prompts then share one pool through a prefix cache keyed by chained block hashes. With a policy,
each prompt's prefill is compressed to the budget and the freed blocks are counted per layer and
KV head.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kvviz.commands.common import add_placement_args
from kvviz.eviction.policies import POLICIES


def add_parser(sub) -> None:
    p = sub.add_parser(
        "blocks",
        help="the cache in fixed-size blocks: waste, prefix sharing, eviction × paging",
        description="Prefill each prompt, lay its KV cache into blocks of --block-size tokens, share "
        "full blocks across prompts by chained hash, and (with --policy) count the "
        "blocks an eviction really frees.",
    )
    p.add_argument("--prompt", action="append", default=[], help="a prompt (repeat for more)")
    p.add_argument("--prompt-file", action="append", default=[], type=Path, help="a UTF-8 prompt file (repeat)")
    p.add_argument("--chat", action="store_true", help="wrap each prompt in the model's chat template")
    p.add_argument("--block-size", type=int, default=16, help="tokens per block (default 16)")
    p.add_argument(
        "--policy",
        choices=[n for n in POLICIES if n != "full"],
        default=None,
        help="evict each prompt's prefill with this policy (default parameters)",
    )
    p.add_argument("--budget", type=int, default=None, help="with --policy: entries kept per layer and KV head")
    p.add_argument("--model", default=None, help="bundled (default), a local folder, or a Hugging Face id")
    p.add_argument("--device", default=None, help="cpu, cuda, mps (default: best available)")
    p.add_argument("--dtype", default=None, help="float32, bfloat16, float16 (default: fp32 on CPU, bf16 on GPU)")
    add_placement_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object (sizes in bytes)")
    p.set_defaults(func=run)


def _prompts(args: argparse.Namespace) -> list[tuple[str, str]]:
    out = [(f"--prompt {i + 1}", text) for i, text in enumerate(args.prompt)]
    for path in args.prompt_file:
        try:
            out.append((path.name, path.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"Cannot read prompt file {path}: {exc}") from exc
    if not out:
        raise ValueError("Give at least one --prompt or --prompt-file.")
    for name, text in out:
        if not text.strip():
            raise ValueError(f"{name} is empty.")
    return out


def run(args: argparse.Namespace) -> int:
    from kvviz.blocks.hashing import check_block_size
    from kvviz.blocks.live import blocks_report
    from kvviz.commands.common import load
    from kvviz.eviction.policies import make_policy

    check_block_size(args.block_size)
    if (args.policy is None) != (args.budget is None):
        raise ValueError("--policy and --budget go together.")
    prompts = _prompts(args)
    policy = make_policy(args.policy) if args.policy else None
    out = blocks_report(load(args), prompts, args.chat, args.block_size, policy, args.budget)
    if args.json:
        print(json.dumps(out))
        return 0
    b = out["block_size"]
    print(f"{out['model']}: blocks of {b} tokens, {out['bytes_per_block']:,} bytes per block over every layer")
    for p in out["prompts"]:
        print(
            f"{p['name']}: {p['prompt_tokens']} tokens → {p['blocks'][0]} blocks per layer, {p['wasted_slots']} "
            f"empty slots in the last; {p['cached_blocks']} block(s) found in the prefix cache"
        )
        if policy is not None:
            print(
                f"  {policy.name} at {args.budget}: evicted {sum(map(sum, p['tokens_evicted'])):,} entries, freed "
                f"{sum(map(sum, p['blocks_freed'])):,} blocks (layer × KV head); compaction would move "
                f"{p['compaction_bytes_moved']:,} bytes"
            )
    print(
        f"shared: {out['shared_blocks']} full block(s) of common prefix; saved {out['bytes_saved']:,} bytes and "
        f"{out['prefill_tokens_saved']:,} prefill tokens"
    )
    return 0
