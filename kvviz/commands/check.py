"""``python -m kvviz check``: where a cached run first leaves its full recomputation (the debugger).

    python -m kvviz check --prompt "Why is the sky blue?" --json                      # no fault: all clear
    python -m kvviz check --prompt "…" --fault causal_decode --step 3 --layer 5 --json
    python -m kvviz check --chapter                                                 # the chapter's check, layer 0

Per step × layer the run's K, V, attention output and logits are compared with one recomputation
from scratch; the first (step, layer, KV head, position) beyond the dtype's tolerance is reported,
and whether the generated tokens changed. ``--fault`` switches on one bug of the zoo
(``kvviz/capture/faults/``) in the cached run only.
"""

from __future__ import annotations

import argparse
import json

from kvviz.capture.faults import FAULTS


def add_parser(sub) -> None:
    p = sub.add_parser(
        "check",
        help="first divergence of a cached run from its recomputation; a zoo of KV-cache bugs",
        description="Run greedily with the KV cache (optionally broken on purpose by --fault), recompute the "
        "sequence from scratch, and report the first step, layer, KV head and position where K, V, the "
        "attention output or the logits leave the dtype's tolerance.",
    )
    p.add_argument("--prompt", default="Why is the sky blue? Answer in one sentence.", help="prompt text")
    p.add_argument("--no-chat", action="store_true", help="do not wrap the prompt in the chat template")
    p.add_argument("--max-new-tokens", type=int, default=16, help="tokens to generate (default 16)")
    p.add_argument("--fault", choices=["none", *FAULTS], default="none", help="the bug to switch on (default none)")
    p.add_argument("--step", type=int, default=1, help="the decode step the fault strikes first (default 1)")
    p.add_argument("--layer", type=int, default=0, help="the layer it strikes (default 0)")
    p.add_argument("--block", type=int, default=1, help="prefix_block_off_by_one: the first wrong block")
    p.add_argument("--chapter", action="store_true", help="the chapter's KVCache code on layer 0 instead")
    p.add_argument("--model", default=None, help="bundled (default), a local folder, or a Hugging Face id")
    p.add_argument("--device", default=None, help="cpu, cuda, mps (default: best available)")
    p.add_argument("--dtype", default=None, help="float32, bfloat16, float16 (default: fp32 on CPU, bf16 on GPU)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from kvviz.capture.divergence import debug, verdict
    from kvviz.capture.faults import make_fault
    from kvviz.models import load_model

    fault = None if args.fault == "none" else make_fault(args.fault, args.step, args.layer, args.block)
    lm = load_model(args.model, device=args.device, dtype=args.dtype)
    if args.chapter:
        from dataclasses import asdict

        from kvviz.lessons.chapter_cache import chapter_check

        check = chapter_check(lm)
        print(json.dumps(asdict(check)) if args.json else check.text())
        return 0
    report = debug(lm, args.prompt, fault, chat=not args.no_chat, max_new_tokens=args.max_new_tokens)
    if args.json:
        print(json.dumps(report.to_json(), ensure_ascii=False))
        return 0
    print(verdict(report.to_json()))
    return 0
