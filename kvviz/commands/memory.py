"""``python -m kvviz memory``: KV-cache size, batch capacity and decode time for any model config.

    python -m kvviz memory --preset Llama-3-70B --context 8192 --batch 162 \\
        --gpus 8 --gpu-mem-gb 80 --reserve 0.1 --weights-gb 140 --bandwidth-tbps 3.35 --json
"""

from __future__ import annotations

import argparse
import json

from kvviz.memory.estimate import KV_DTYPES


def add_parser(sub) -> None:
    p = sub.add_parser(
        "memory",
        help="KV-cache size, capacity and decode time for a model config",
        description="Size the KV cache of any transformers config (GQA, MQA, MLA, sliding windows, hybrids), "
        "how many sequences fit on your GPUs and how long a decode step must take. "
        "--gpu-mem-gb and --bandwidth-tbps are per GPU; with --gpus N the totals are N times that.",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--preset", help="a bundled model preset (see --list)")
    src.add_argument("--config", help="a config.json file (or the folder holding one)")
    src.add_argument("--list", action="store_true", help="list the model and GPU presets and exit")
    p.add_argument("--context", type=int, default=8192, help="tokens per sequence (default 8192)")
    p.add_argument("--batch", type=int, default=1, help="sequences (default 1)")
    p.add_argument("--kv-dtype", default="bf16", help=f"one of {', '.join(KV_DTYPES)} (default bf16)")
    p.add_argument(
        "--group-size",
        type=int,
        default=None,
        help="count an fp16 scale and zero point per this many elements (low-bit KV)",
    )
    p.add_argument("--tp", type=int, default=None, help="tensor-parallel degree (default: --gpus, else 1)")
    p.add_argument("--gpu", default=None, help="a GPU preset, e.g. H100: sets --gpu-mem-gb and --bandwidth-tbps")
    p.add_argument("--gpus", type=int, default=None, help="number of GPUs (default 1)")
    p.add_argument("--gpu-mem-gb", type=float, default=None, help="memory per GPU, decimal GB")
    p.add_argument("--reserve", type=float, default=0.1, help="fraction kept for activations/workspace (0.1)")
    p.add_argument(
        "--weights-gb",
        type=float,
        default=None,
        help="weights in decimal GB (default: the preset's parameters × --weight-dtype)",
    )
    p.add_argument("--weight-dtype", default="bf16", help="bytes per parameter for the default weights (bf16)")
    p.add_argument("--bandwidth-tbps", type=float, default=None, help="memory bandwidth per GPU, TB/s")
    p.add_argument(
        "--block-size",
        type=int,
        default=None,
        help="paged engine: tokens per KV block; adds the "
        "start-up numbers a vLLM-style engine logs (`engine` in the JSON)",
    )
    p.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="paged engine: tokens per request (default: the config's context)",
    )
    p.add_argument("--json", action="store_true", help="print JSON (all sizes in bytes)")
    p.set_defaults(func=run)


def _list() -> int:
    from kvviz.memory.capacity import gpu_presets
    from kvviz.memory.estimate import preset_names

    print("models: " + ", ".join(preset_names()))
    for g in gpu_presets().values():
        print(f"gpu: {g.name}: {g.memory_gb:g} GB, {g.bandwidth_tbps:g} TB/s")
    return 0


def _human(r: dict, layout) -> str:
    from kvviz.memory.estimate import estimate, format_bytes, format_gb, layer_groups

    est = estimate(layout, r["context"], r["batch"], r["kv_dtype"], r["tp"], r["group_size"])
    lines = [
        f"{r['model']} ({r['model_type']}): {r['attention']}, {r['num_layers']} layers, "
        f"{layout.num_attention_heads} query / {r['num_key_value_heads']} KV heads, head_dim {r['head_dim']}, "
        f"KV dtype {r['kv_dtype']}" + (f" (+fp16 scale & zero per {r['group_size']})" if r["group_size"] else "")
    ]
    for g in layer_groups(layout, est):
        held = f", {g.tokens_held:,} tokens held" + (f" (window {g.window})" if g.window else "")
        lines.append(
            f"  {g.count} {g.kind} layer{'s' if g.count > 1 else ''}: {g.per_token_expr} per token per "
            f"layer{held} → {g.bytes:,} bytes ({format_bytes(g.bytes)}) per sequence"
        )
    lines.append(f"per token (every layer): {r['bytes_per_token']:,} bytes ({format_bytes(r['bytes_per_token'])})")
    lines.append(
        f"per sequence at {r['context']:,} tokens: {r['bytes_per_sequence']:,} bytes "
        f"({format_bytes(r['bytes_per_sequence'])})"
    )
    rep = f", × {r['replication']:g} replication over TP={r['tp']}" if r["replication"] != 1 else ""
    lines.append(
        f"total for {r['batch']:,} sequence{'s' if r['batch'] > 1 else ''}{rep}: {r['total_bytes']:,} bytes "
        f"({format_bytes(r['total_bytes'])}); per GPU {format_bytes(r['per_gpu_bytes'])} (TP={r['tp']})"
    )
    if "kv_budget_bytes" in r:
        mc = r["max_context"]
        lines.append(
            f"capacity: {r['gpus']} × {format_gb(r['gpu_mem_bytes'])} = {format_gb(r['total_mem_bytes'])}; "
            f"{r['reserve']:.0%} reserve → {format_gb(r['usable_bytes'])} usable; weights "
            f"{format_gb(r['weight_bytes'])} → KV budget {format_gb(r['kv_budget_bytes'])} "
            f"({format_bytes(r['kv_budget_bytes'])})"
        )
        lines.append(
            f"  → {r['max_sequences']:,} sequences fit at {r['context']:,} tokens; {r['batch']:,} "
            f"sequence{'s' if r['batch'] > 1 else ''} fit up to "
            + ("any context (windows cap the cache)" if mc is None else f"{mc:,} tokens")
            + ("" if r["fits"] else "  [the requested batch does NOT fit]")
        )
    if "decode_ms_kv" in r:
        lines.append(
            f"decode step: weights {format_gb(r['weight_bytes'])} + KV {format_gb(r['total_bytes'])} over "
            f"{r['bandwidth_bytes_per_s'] / 1e12:g} TB/s → {r['decode_ms_weights']:.2f} ms + "
            f"{r['decode_ms_kv']:.2f} ms = {r['decode_ms_total']:.2f} ms (lower bound on time per token)"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from kvviz.memory.capacity import find_gpu, report
    from kvviz.memory.estimate import cache_layout, load_preset

    if args.list:
        return _list()
    mem, bw = args.gpu_mem_gb, args.bandwidth_tbps
    if args.gpu:
        gpu = find_gpu(args.gpu)
        mem = gpu.memory_gb if mem is None else mem
        bw = gpu.bandwidth_tbps if bw is None else bw
    if (args.gpus is not None or args.weights_gb is not None) and mem is None and bw is None:
        raise ValueError("--gpus/--weights-gb need --gpu-mem-gb (or --gpu) and/or --bandwidth-tbps.")
    layout = cache_layout(load_preset(args.preset) if args.preset else _config_path(args.config))
    r = report(
        layout,
        context=args.context,
        batch=args.batch,
        kv_dtype=args.kv_dtype,
        tp=args.tp,
        group_size=args.group_size,
        gpus=args.gpus,
        gpu_mem_gb=mem,
        reserve=args.reserve,
        weights_gb=args.weights_gb,
        weight_dtype=args.weight_dtype,
        bandwidth_tbps=bw,
    )
    if args.block_size is not None or args.max_model_len is not None:
        from kvviz.memory.engine import from_report

        r["engine"] = from_report(layout, r, args.block_size or 16, args.max_model_len).to_json()
    print(json.dumps(r) if args.json else _human(r, layout) + ("\n" + r["engine"]["log"] if "engine" in r else ""))
    return 0


def _config_path(path: str):
    from pathlib import Path

    p = Path(path).expanduser()
    if not p.exists():
        raise ValueError(f"--config {path}: no such file (use --preset for the bundled models).")
    return p
