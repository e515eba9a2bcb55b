"""Record NVIDIA kvpress's kept KV positions on the bundled model: tests/data/kvpress_kept.json.

The reference side of the parity test (tests/eviction/test_kvpress_parity.py): with fp32 and exact
attention, kvviz's StreamingLLM, SnapKV, KNorm, TOVA, ExpectedAttention, PyramidKV and AdaKV (around
SnapKV) must keep exactly the positions kvpress's presses of those names keep, per layer and KV head.
kvpress 0.5.x pins
transformers < 5.3, so this script runs ONLY in a separate env and never imports kvviz; the token
ids come from tests/data/kvpress_prompts.json (written in the kvviz env by
``.venv/bin/python -m tools.kvpress_prompts``). Create the env and run it (CPU torch from PyPI)::

    python3 -m venv /tmp/kvpress-env
    /tmp/kvpress-env/bin/pip install "torch==2.13.0" "kvpress==0.5.5"
    /tmp/kvpress-env/bin/python tools/kvpress_reference.py \
        [--model ~/.cache/kvviz/models/SmolLM2-135M-Instruct] [--presses KVzipPress]

``--presses`` records only those presses' cases and keeps every other case of the existing file as it is.

The model folder is the bundled GGUF converted by kvviz (``load_model()`` creates it on first use).
How the kept positions are read: a wrapper around the press's own ``compress`` matches every row
of the compressed keys with the row of the full keys it was gathered from, so the record is what
kvpress really kept, not a re-implementation of its choice. A wrapper around ``score`` notes, per
case, the smallest gap between the last kept and the first dropped score: a tiny gap would mean a
rounding difference could flip the choice. SnapKV, TOVA and PyramidKV are run twice, with SDPA
(kvpress recomputes the window attention from the queries) and with eager attention (kvpress reads
the model's own attention weights), and the script fails if the two disagree. PyramidKV keeps a
different number of entries per layer (recorded per layer); AdaKV keeps every entry and masks the
evicted ones per head (``module.masked_key_indices``), so its kept set is the complement of the mask.
KVzip runs its context-reconstruction pass when the press's context manager exits and then masks the
same way (SDPA only: kvpress refuses eager); its kept sets are scattered over the context, so they are
stored as one hexadecimal bit mask per layer and KV head (``kept_mask``: bit p set = position p kept)
instead of runs, with the header length kvpress read from the chat template and each repeat pass's
prompt ids (the tokens before the repeated context).
"""

from __future__ import annotations

import argparse
import json
from importlib.metadata import version
from pathlib import Path

import kvpress
import torch
import transformers
from kvpress import (
    AdaKVPress,
    ExpectedAttentionPress,
    KnormPress,
    KVzipPress,
    PyramidKVPress,
    SnapKVPress,
    StreamingLLMPress,
    TOVAPress,
)
from transformers import AutoModelForCausalLM, DynamicCache

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ROOT / "tests" / "data" / "kvpress_prompts.json"
OUT = ROOT / "tests" / "data" / "kvpress_kept.json"
DEFAULT_MODEL = Path.home() / ".cache" / "kvviz" / "models" / "SmolLM2-135M-Instruct"

# (prompt, press name, press parameters): kvpress defaults (window 64, kernel 5, 4 sinks) plus a
# few non-default ones; ratio 0.8 on 350 tokens gives int(69.99999999999999) = 69 kept, testing
# that both sides round n_kept the same way. SnapKV cases keep n_kept >= window_size.
CASES: list[tuple[str, str, dict]] = [
    *[
        (p, "StreamingLLMPress", {"compression_ratio": r, "n_sink": 4})
        for p, rs in (("needle_chat", (0.5, 0.75, 0.8)), ("chapter_300", (0.5, 0.75)))
        for r in rs
    ],
    ("chapter_300", "StreamingLLMPress", {"compression_ratio": 0.6, "n_sink": 8}),
    *[
        (p, "SnapKVPress", {"compression_ratio": r, "window_size": 64, "kernel_size": 5})
        for p, rs in (("needle_chat", (0.5, 0.75, 0.8)), ("chapter_300", (0.5, 0.75)))
        for r in rs
    ],
    ("chapter_300", "SnapKVPress", {"compression_ratio": 0.75, "window_size": 16, "kernel_size": 7}),
    ("needle_chat", "SnapKVPress", {"compression_ratio": 0.5, "window_size": 32, "kernel_size": 3}),
    # the presses added after the first two: three or more settings on each prompt
    *[(p, "KnormPress", {"compression_ratio": r}) for p in ("needle_chat", "chapter_300") for r in (0.25, 0.5, 0.8)],
    *[(p, "TOVAPress", {"compression_ratio": r}) for p in ("needle_chat", "chapter_300") for r in (0.25, 0.5, 0.8)],
    *[
        (p, "ExpectedAttentionPress", params)
        for p in ("needle_chat", "chapter_300")
        for params in (
            {"compression_ratio": 0.5},
            {"compression_ratio": 0.75},
            {"compression_ratio": 0.5, "n_future_positions": 64, "n_sink": 8, "use_covariance": False},
            {"compression_ratio": 0.6, "use_vnorm": False},
        )
    ],
    # PyramidKV: its defaults (beta 20: max_num capped at L − window, the last layer at the window), a gentler
    # pyramid (beta 2) and a 16-token window
    *[
        (p, "PyramidKVPress", params)
        for p in ("needle_chat", "chapter_300")
        for params in (
            {"compression_ratio": 0.5, "window_size": 64, "kernel_size": 5, "beta": 20},
            {"compression_ratio": 0.5, "window_size": 64, "kernel_size": 5, "beta": 2},
            {"compression_ratio": 0.75, "window_size": 16, "kernel_size": 3, "beta": 4},
        )
    ],
    *[
        (p, "AdaKVPress", params)
        for p in ("needle_chat", "chapter_300")
        for params in (
            {"compression_ratio": 0.5, "window_size": 64, "kernel_size": 5, "alpha_safeguard": 0.2},
            {"compression_ratio": 0.75, "window_size": 64, "kernel_size": 5, "alpha_safeguard": 0.2},
            {"compression_ratio": 0.75, "window_size": 16, "kernel_size": 7, "alpha_safeguard": 0.5},
        )
    ],
    # KVzip: kvpress's defaults (4 sinks, one global bottom-k, chunks of 2048: one pass), its per-layer budget,
    # and 128-token chunks (three repeat passes, the later ones quoting the chunk before) with 8 sinks
    *[
        (p, "KVzipPress", params)
        for p in ("needle_chat", "chapter_300")
        for params in (
            {"compression_ratio": 0.25},
            {"compression_ratio": 0.5},
            {"compression_ratio": 0.75},
            {"compression_ratio": 0.5, "layerwise": True},
            {"compression_ratio": 0.6, "n_sink": 8, "chunk_size": 128},
        )
    ],
]
PRESSES = {
    "StreamingLLMPress": StreamingLLMPress,
    "SnapKVPress": SnapKVPress,
    "KnormPress": KnormPress,
    "TOVAPress": TOVAPress,
    "ExpectedAttentionPress": ExpectedAttentionPress,
    "PyramidKVPress": PyramidKVPress,
}
EAGER_CHECK = {"SnapKVPress", "TOVAPress", "PyramidKVPress"}  # presses that read attention weights when given


def make_press(name: str, params: dict):
    """The press for a case; AdaKV wraps a SnapKVPress built from the case's other parameters."""
    if name == "AdaKVPress":
        inner = {k: v for k, v in params.items() if k != "alpha_safeguard"}
        return AdaKVPress(SnapKVPress(**inner), alpha_safeguard=params["alpha_safeguard"])
    return PRESSES[name](**params)


def to_ranges(positions: list[int]) -> list[list[int]]:
    """Sorted positions → half-open [start, stop) runs, e.g. [0,1,2,5,6] → [[0,3],[5,7]]."""
    runs: list[list[int]] = []
    for p in positions:
        if runs and runs[-1][1] == p:
            runs[-1][1] = p + 1
        else:
            runs.append([p, p + 1])
    return runs


def recover_positions(full: torch.Tensor, kept: torch.Tensor) -> list[list[int]]:
    """Per KV head, the sorted positions of ``full`` whose key rows make up ``kept``.

    full: [1, Hkv, L, D]; kept: [1, Hkv, n, D]. Each kept row must equal exactly one full row.
    """
    same = (kept[0][:, :, None, :] == full[0][:, None, :, :]).all(-1)  # [Hkv, n, L]
    if not bool((same.sum(-1) == 1).all()):
        raise RuntimeError("a compressed key matches no (or several) original keys")
    return [sorted(int(i) for i in row) for row in same.float().argmax(-1)]  # [Hkv][n]


def score_gap(scores: torch.Tensor, n: int) -> float | None:
    """Smallest gap, over rows, between the n-th and (n+1)-th largest score ([..., k]); None if all are kept."""
    if n >= scores.shape[-1]:
        return None
    top = scores.float().topk(n + 1, dim=-1).values
    return float((top[..., n - 1] - top[..., n]).min())


def adakv_kept(press, module, hidden_states, keys, values, attentions, kwargs) -> tuple[list[list[int]], float | None]:
    """AdaKV's kept positions per KV head (the complement of what it masks) and its global score gap."""
    masked = module.masked_key_indices
    hkv, k_len = keys.shape[1], keys.shape[2]
    keep = torch.ones(hkv, k_len, dtype=torch.bool)
    if masked is not None:
        keep[masked[1].cpu(), masked[2].cpu()] = False
    scores = press.press.score(module, hidden_states, keys, values, attentions, kwargs)  # as AdaKV saw them
    n_kept = kvpress.utils.compute_n_kept(k_len, press.compression_ratio)
    n_safe = max(1, int(n_kept * press.alpha_safeguard)) if press.alpha_safeguard > 0 else 0
    scores.scatter_(-1, torch.topk(scores, n_safe, dim=-1).indices, torch.finfo(scores.dtype).max)
    flat = scores.reshape(-1).float().sort().values
    n_pruned = hkv * (k_len - n_kept)
    gap = float(flat[n_pruned] - flat[n_pruned - 1]) if 0 < n_pruned < flat.numel() else None
    return [torch.nonzero(row).flatten().tolist() for row in keep], gap


def to_mask(positions: list[int]) -> str:
    """Sorted positions → a hexadecimal bit mask (bit p set = position p kept)."""
    return format(sum(1 << p for p in positions), "x")


def run_kvzip(model, ids: torch.Tensor, params: dict) -> dict:
    """Prefill ``ids`` under KVzipPress: kept positions per layer and KV head (the complement of its mask),
    the repeat passes it fed, and the gap between the last evicted and the first kept score."""
    press = KVzipPress(**params)
    seen: dict = {}
    prepare, compress_post = press.prepare, press.compress_post

    def recording_prepare(model, tokenizer, *args, **kwargs):
        pairs = prepare(model, tokenizer, *args, **kwargs)
        seen["header"] = int(press.prefix_length)
        seen["chunks"] = [
            [
                press.prefix_length + i * press.chunk_size,
                r.shape[1] - a.shape[1],
                r[0, : r.shape[1] - a.shape[1]].tolist(),
            ]
            for i, (a, r) in enumerate(pairs)
        ]
        return pairs

    def recording_compress_post(model):
        seen["scores"] = press.score_val.clone()  # [Lyr, 1, Hkv, n]
        compress_post(model)

    press.prepare, press.compress_post = recording_prepare, recording_compress_post  # instance attributes only
    with torch.inference_mode(), press(model):
        model(input_ids=ids, past_key_values=DynamicCache(), use_cache=True)
    layers, n = model.config.num_hidden_layers, ids.shape[1]
    kept = []
    for layer in model.model.layers:
        keep = torch.ones(model.config.num_key_value_heads, n, dtype=torch.bool)
        _, heads, seq = layer.self_attn.masked_key_indices
        keep[heads.cpu(), seq.cpu()] = False
        kept.append([to_mask(torch.nonzero(row).flatten().tolist()) for row in keep])
    scores = seen["scores"][:, 0].float().clone()  # out of inference mode
    scores[..., : press.n_sink] = scores.amax() + 1.0
    ratio = params["compression_ratio"]
    if params.get("layerwise"):
        k = int(scores.shape[1] * n * ratio)
        flat = scores.reshape(layers, -1).sort(-1).values
        gap = float((flat[:, k] - flat[:, k - 1]).min())
    else:
        k = int(scores.numel() * ratio)
        flat = scores.reshape(-1).sort().values
        gap = float(flat[k] - flat[k - 1])
    counts = [[bin(int(h, 16)).count("1") for h in layer] for layer in kept]
    return {
        "n_kept": None,
        "n_kept_total": sum(map(sum, counts)),
        "min_score_gap": gap,
        "header": seen["header"],
        "repeat_chunks": seen["chunks"],  # [start, prompt tokens, the prompt ids before the repeated context]
        "kept_mask": kept,
    }


def run_case(model, ids: torch.Tensor, press_name: str, params: dict) -> dict:
    """Prefill ``ids`` under the press; kept positions per layer and KV head, and the score gap."""
    press = make_press(press_name, params)
    kept: dict[int, list[list[int]]] = {}
    gaps: list[float] = []
    n_kept: dict[int, int] = {}
    scorer = press.press if press_name == "AdaKVPress" else press
    compress, score = press.compress, scorer.score

    def recording_score(module, hidden_states, keys, values, attentions, kwargs):
        scores = score(module, hidden_states, keys, values, attentions, kwargs)  # [1, Hkv, L]
        if press_name == "PyramidKVPress":
            n = press.get_layer_budget(module, keys.shape[2])
        else:
            n = kvpress.utils.compute_n_kept(keys.shape[2], press.compression_ratio)
        gap = score_gap(scores, n) if press_name != "AdaKVPress" else None
        if gap is not None:
            gaps.append(gap)
        return scores

    def recording_compress(module, hidden_states, keys, values, attentions, kwargs):
        new_keys, new_values = compress(module, hidden_states, keys, values, attentions, kwargs)
        if press_name == "AdaKVPress":
            kept[module.layer_idx], gap = adakv_kept(press, module, hidden_states, keys, values, attentions, kwargs)
            if gap is not None:
                gaps.append(gap)
            n_kept[module.layer_idx] = sum(len(h) for h in kept[module.layer_idx]) // keys.shape[1]
        else:
            kept[module.layer_idx] = recover_positions(keys, new_keys)
            n_kept[module.layer_idx] = new_keys.shape[2]
        return new_keys, new_values

    scorer.score, press.compress = recording_score, recording_compress  # instance attributes only
    cache = DynamicCache()
    with torch.inference_mode(), press(model):
        model(input_ids=ids, past_key_values=cache, use_cache=True)
    layers = model.config.num_hidden_layers
    per_layer = [n_kept[i] for i in sorted(n_kept)]
    if sorted(kept) != list(range(layers)) or (press_name != "PyramidKVPress" and len(set(per_layer)) != 1):
        raise RuntimeError(f"press ran on layers {sorted(kept)} with kept lengths {per_layer}")
    out = {
        "n_kept": per_layer[0] if len(set(per_layer)) == 1 else None,
        "min_score_gap": min(gaps) if gaps else None,
        "kept": [[to_ranges(head) for head in kept[i]] for i in range(layers)],
    }
    if press_name == "PyramidKVPress":
        out["n_kept_per_layer"] = per_layer
    return out


def load(folder: Path, attn: str):
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation=attn)
    return model.eval().requires_grad_(False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="converted bundled model folder")
    ap.add_argument("--presses", default="", help="comma-separated press names to re-record (default: all)")
    args = ap.parse_args()
    prompts = json.loads(PROMPTS.read_text())["prompts"]
    sdpa, eager = load(args.model, "sdpa"), load(args.model, "eager")
    only = {p for p in args.presses.split(",") if p}
    kept_before = json.loads(OUT.read_text())["cases"] if only else []
    if only and json.loads(OUT.read_text())["prompts"] != prompts:
        raise RuntimeError("The prompts changed: re-record every press (leave out --presses).")
    cases = [c for c in kept_before if c["press"] not in only]
    for prompt, press_name, params in CASES:
        if only and press_name not in only:
            continue
        ids = torch.tensor([prompts[prompt]["token_ids"]])
        if press_name == "KVzipPress":
            result = run_kvzip(sdpa, ids, params)
            cases.append({"prompt": prompt, "press": press_name, "params": params, "n_tokens": ids.shape[1], **result})
            print(f"{prompt:12s} {press_name:18s} {params} kept={result['n_kept_total']} gap={result['min_score_gap']}")
            continue
        result = run_case(sdpa, ids, press_name, params)
        if press_name in EAGER_CHECK:  # the attention-weights path must pick the same set
            other = run_case(eager, ids, press_name, params)
            if other["kept"] != result["kept"]:
                raise RuntimeError(f"kvpress SDPA and eager disagree on {prompt} {press_name} {params}")
        cases.append({"prompt": prompt, "press": press_name, "params": params, "n_tokens": ids.shape[1], **result})
        print(
            f"{prompt:12s} {press_name:18s} {params} n_kept={result['n_kept']} min_score_gap={result['min_score_gap']}"
        )
    record = {
        "about": (
            "kvpress kept positions per case: kept[layer][kv_head] = half-open [start, stop) runs, or "
            "kept_mask[layer][kv_head] = hexadecimal bit mask (bit p set = position p kept)"
        ),
        "kvpress": version("kvpress"),
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "dtype": "float32",
        "attn_implementation": f"sdpa ({', '.join(sorted(EAGER_CHECK))} also checked with eager)",
        "model": str(args.model.name),
        "prompts": prompts,
        "cases": cases,
    }
    OUT.write_text(json.dumps(record, separators=(",", ":")) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size / 1024:.1f} KiB)")


if __name__ == "__main__":
    main()
