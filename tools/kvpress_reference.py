"""Record NVIDIA kvpress's kept KV positions on the bundled model: tests/data/kvpress_kept.json.

The reference side of the parity test (tests/eviction/test_kvpress_parity.py): with fp32 and exact
attention, kvviz's StreamingLLM and SnapKV must keep exactly the positions kvpress's
``StreamingLLMPress`` and ``SnapKVPress`` keep, per layer and KV head. kvpress 0.5.x pins
transformers < 5.3, so this script runs ONLY in a separate env and never imports kvviz; the token
ids come from tests/data/kvpress_prompts.json (written in the kvviz env by
``.venv/bin/python -m tools.kvpress_prompts``). Create the env and run it (CPU torch from PyPI)::

    python3 -m venv /tmp/kvpress-env
    /tmp/kvpress-env/bin/pip install "torch==2.13.0" "kvpress>=0.5,<0.6"
    /tmp/kvpress-env/bin/python tools/kvpress_reference.py \
        [--model ~/.cache/kvviz/models/SmolLM2-135M-Instruct]

The model folder is the bundled GGUF converted by kvviz (``load_model()`` creates it on first use).
How the kept positions are read: a wrapper around the press's own ``compress`` matches every row
of the compressed keys with the row of the full keys it was gathered from, so the record is what
kvpress really kept, not a re-implementation of its choice. A wrapper around ``score`` notes, per
case, the smallest gap between the last kept and the first dropped score: a tiny gap would mean a
rounding difference could flip the choice. SnapKV is run twice, with SDPA (kvpress recomputes the
window attention from the queries) and with eager attention (kvpress reads the model's own
attention weights), and the script fails if the two disagree.
"""

from __future__ import annotations

import argparse
import json
from importlib.metadata import version
from pathlib import Path

import kvpress
import torch
import transformers
from kvpress import SnapKVPress, StreamingLLMPress
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
]
PRESSES = {"StreamingLLMPress": StreamingLLMPress, "SnapKVPress": SnapKVPress}


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


def run_case(model, ids: torch.Tensor, press_name: str, params: dict) -> dict:
    """Prefill ``ids`` under the press; kept positions per layer and KV head, and the score gap."""
    press = PRESSES[press_name](**params)
    kept: dict[int, list[list[int]]] = {}
    gaps: list[float] = []
    n_kept: set[int] = set()
    compress, score = press.compress, press.score

    def recording_score(module, hidden_states, keys, values, attentions, kwargs):
        scores = score(module, hidden_states, keys, values, attentions, kwargs)  # [1, Hkv, L]
        n = kvpress.utils.compute_n_kept(keys.shape[2], press.compression_ratio)
        if n < keys.shape[2]:
            top = scores.float().topk(n + 1, dim=-1).values  # [1, Hkv, n+1]
            gaps.append(float((top[..., n - 1] - top[..., n]).min()))
        return scores

    def recording_compress(module, hidden_states, keys, values, attentions, kwargs):
        new_keys, new_values = compress(module, hidden_states, keys, values, attentions, kwargs)
        kept[module.layer_idx] = recover_positions(keys, new_keys)
        n_kept.add(new_keys.shape[2])
        return new_keys, new_values

    press.score, press.compress = recording_score, recording_compress  # instance attributes only
    cache = DynamicCache()
    with torch.inference_mode(), press(model):
        model(input_ids=ids, past_key_values=cache, use_cache=True)
    layers = model.config.num_hidden_layers
    if sorted(kept) != list(range(layers)) or len(n_kept) != 1:
        raise RuntimeError(f"press ran on layers {sorted(kept)} with kept lengths {n_kept}")
    return {
        "n_kept": n_kept.pop(),
        "min_score_gap": min(gaps) if gaps else None,
        "kept": [[to_ranges(head) for head in kept[i]] for i in range(layers)],
    }


def load(folder: Path, attn: str):
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation=attn)
    return model.eval().requires_grad_(False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="converted bundled model folder")
    args = ap.parse_args()
    prompts = json.loads(PROMPTS.read_text())["prompts"]
    sdpa, eager = load(args.model, "sdpa"), load(args.model, "eager")
    cases = []
    for prompt, press_name, params in CASES:
        ids = torch.tensor([prompts[prompt]["token_ids"]])
        result = run_case(sdpa, ids, press_name, params)
        if press_name == "SnapKVPress":  # the attention-weights path must pick the same set
            other = run_case(eager, ids, press_name, params)
            if other["kept"] != result["kept"]:
                raise RuntimeError(f"kvpress SDPA and eager disagree on {prompt} {params}")
        cases.append({"prompt": prompt, "press": press_name, "params": params, "n_tokens": ids.shape[1], **result})
        print(
            f"{prompt:12s} {press_name:18s} {params} n_kept={result['n_kept']} min_score_gap={result['min_score_gap']}"
        )
    record = {
        "about": "kvpress kept positions per case: kept[layer][kv_head] = half-open [start, stop) runs",
        "kvpress": version("kvpress"),
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "dtype": "float32",
        "attn_implementation": "sdpa (SnapKV also checked with eager)",
        "model": str(args.model.name),
        "prompts": prompts,
        "cases": cases,
    }
    OUT.write_text(json.dumps(record, separators=(",", ":")) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size / 1024:.1f} KiB)")


if __name__ == "__main__":
    main()
