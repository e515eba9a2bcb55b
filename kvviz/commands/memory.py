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
    from kvviz.memory.layout import preset_names

    print("models: " + ", ".join(preset_names()))
    for g in gpu_presets().values():
        print(f"gpu: {g.name}: {g.memory_gb:g} GB, {g.bandwidth_tbps:g} TB/s")
    return 0


def run(args: argparse.Namespace) -> int:
    from kvviz.memory.capacity import find_gpu
    from kvviz.memory.estimate import resolve_kv_dtype
    from kvviz.memory.layout import cache_layout, load_preset
    from kvviz.memory.report import MemoryRequest, report, summary

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
        MemoryRequest(
            layout,
            context=args.context,
            batch=args.batch,
            kv_dtype=resolve_kv_dtype(args.kv_dtype, args.group_size),
            tp=args.tp,
            gpus=args.gpus,
            gpu_mem_gb=mem,
            reserve=args.reserve,
            weights_gb=args.weights_gb,
            weight_dtype=args.weight_dtype,
            bandwidth_tbps=bw,
        )
    )
    out = r.to_json()
    if args.block_size is not None or args.max_model_len is not None:
        from kvviz.memory.paged import from_report

        out["engine"] = from_report(layout, out, args.block_size or 16, args.max_model_len).to_json()
    print(json.dumps(out) if args.json else summary(r) + ("\n" + out["engine"]["log"] if "engine" in out else ""))
    return 0


def _config_path(path: str):
    from pathlib import Path

    p = Path(path).expanduser()
    if not p.exists():
        raise ValueError(f"--config {path}: no such file (use --preset for the bundled models).")
    return p
