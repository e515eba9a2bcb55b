"""``python -m kvviz trace``: generate with the real model and print what its KV cache did."""

from __future__ import annotations

import argparse
import json

from kvviz.commands.common import add_prompt_args, load, read_prompt


def add_parser(sub) -> None:
    p = sub.add_parser(
        "trace",
        help="generate while capturing the KV cache",
        description="Generate with the model, capture every step's KV cache, print a summary.",
    )
    add_prompt_args(p)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-verify", action="store_true", help="skip the cached-vs-recompute check")
    p.add_argument("--out", default=None, help="save the trace to this .npz file")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from kvviz.capture.loop import capture
    from kvviz.capture.model_io import Sampling

    prompt = read_prompt(args)
    if not prompt.strip():
        raise ValueError("The prompt is empty: pass --prompt TEXT or a non-empty --prompt-file.")
    lm = load(args)
    trace = capture(
        lm,
        prompt,
        chat=args.chat,
        max_new_tokens=args.max_new_tokens,
        sampling=Sampling(args.temperature, args.top_p, args.seed),
        verify=not args.no_verify,
    )
    if args.out:
        trace.save(args.out)
    summary = trace.summary()
    if args.json:
        print(json.dumps(summary))
        return 0
    m = summary["model"]
    print(
        f"model {m['name']}: {m['layers']} layers, {m['q_heads']} query / {m['kv_heads']} KV heads, "
        f"head dim {m['head_dim']}, {m['dtype']}"
    )
    print(f"prompt {trace.n_prompt} tokens, generated {trace.n_generated} ({trace.stop_reason})")
    print(f"text: {trace.text}")
    print(f"KV cache: {trace.cache_bytes:,} bytes ({summary['kv_bytes_per_token']:,} bytes/token by the formula)")
    if trace.equivalence:
        print(
            f"cached vs full recompute: max |Δlogit| = {trace.equivalence['max_abs_logit_diff']:.2e}; "
            f"vs the model without capture: {trace.equivalence['max_abs_logit_diff_vs_unpatched']:.2e}"
        )
    return 0
