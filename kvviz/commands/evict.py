"""``python -m kvviz evict``: generate under an eviction policy with a cache that really shrinks.

Example::

    python -m kvviz evict --prompt-file passage.txt --chat --policy snapkv --budget 192 --json
"""

from __future__ import annotations

import argparse
import json

from kvviz.commands.common import add_prompt_args, load, read_prompt
from kvviz.eviction.policies import POLICIES, field_specs


def add_parser(sub) -> None:
    p = sub.add_parser(
        "evict",
        help="generate under an eviction policy (StreamingLLM, H2O, SnapKV, ...)",
        description="Compress the KV cache with a policy after the prefill (and while decoding, "
        "for the policies that do), generate, and print what was kept.",
    )
    add_prompt_args(p)
    p.add_argument("--policy", required=True, choices=list(POLICIES), help="eviction policy")
    budget = p.add_mutually_exclusive_group(required=True)
    budget.add_argument("--budget", type=int, help="tokens kept per layer and KV head")
    budget.add_argument("--ratio", type=float, help="compression ratio r: n_kept = max(1, int(L × (1 − r)))")
    p.add_argument("--sinks", type=int, default=None, help="StreamingLLM: first tokens always kept (default 4)")
    p.add_argument(
        "--reposition",
        action="store_true",
        help="StreamingLLM: re-rotate kept keys to their cache slots (the paper's positions)",
    )
    p.add_argument("--window-size", type=int, default=None, help="SnapKV: observation window (default 64)")
    p.add_argument("--kernel-size", type=int, default=None, help="SnapKV: pooling kernel, odd (default 5)")
    p.add_argument("--pooling", choices=["avg", "max"], default=None, help="SnapKV: vote smoothing (default avg)")
    p.add_argument(
        "--heavy-fraction",
        type=float,
        default=None,
        help="H2O: share of the budget for heavy hitters (default 0.5 = 1:1 with recent)",
    )
    p.add_argument("--question", default=None, help="a question appended after the prompt (blank line between)")
    p.add_argument(
        "--compress-context-only",
        action="store_true",
        help="with --question: compress the prompt alone, then feed the question uncompressed",
    )
    p.set_defaults(func=run, max_new_tokens=32)


_PARAM_FLAGS = {
    "sinks": "sinks",
    "reposition": "reposition",
    "window_size": "window_size",
    "kernel_size": "kernel_size",
    "pooling": "pooling",
    "heavy_fraction": "heavy_fraction",
}


def policy_params(args: argparse.Namespace) -> dict:
    """The policy's hyper-parameters from the flags; a flag the chosen policy does not have is an error."""
    own = {f["name"] for f in field_specs(POLICIES[args.policy])}
    params = {}
    for attr, name in _PARAM_FLAGS.items():
        value = getattr(args, attr)
        if value is None or value is False:
            continue
        if name not in own:
            flag = "--" + attr.replace("_", "-")
            raise ValueError(f"{flag} does not apply to --policy {args.policy}.")
        params[name] = value
    return params


def run(args: argparse.Namespace) -> int:
    from kvviz.eviction.demos import split_question
    from kvviz.eviction.policies import make_policy
    from kvviz.eviction.run import run_policy

    prompt = read_prompt(args)
    if not prompt.strip():
        raise ValueError("The prompt is empty: pass --prompt TEXT or a non-empty --prompt-file.")
    if args.compress_context_only and not args.question:
        raise ValueError("--compress-context-only needs --question.")
    policy = make_policy(args.policy, **policy_params(args))
    lm = load(args)
    ids, n_context = split_question(lm, prompt, args.question or "", args.chat)
    result = run_policy(
        lm,
        ids,
        policy,
        budget=args.budget,
        ratio=args.ratio,
        n_compress=n_context if args.compress_context_only else None,
        max_new_tokens=args.max_new_tokens,
        record_history=False,
    )
    summary = result.summary()
    if args.json:
        print(json.dumps(summary))
        return 0
    print(f"policy {policy.title} {summary['params']}, positions: {result.position_mode}")
    print(
        f"prompt {result.n_prompt} tokens, compressed {result.n_compressed} → kept {result.n_kept} "
        f"per layer and KV head"
    )
    print(f"text: {result.text}")
    print(f"KV cache: {result.cache_bytes:,} bytes (full cache would hold {result.full_cache_bytes:,} bytes)")
    return 0
