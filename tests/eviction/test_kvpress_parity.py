"""kvviz's StreamingLLM and SnapKV keep exactly what NVIDIA kvpress 0.5.x keeps, per layer and KV head.

The reference, tests/data/kvpress_kept.json, was recorded by kvpress's own ``StreamingLLMPress`` and
``SnapKVPress`` on the bundled SmolLM2 (fp32, exact attention) in a separate env — see
tools/kvpress_reference.py for how to rebuild it. Here kvviz must keep the same positions for the
same token ids and compression ratio: every case through the policy's ``select`` on one recorded
prefill per prompt (kept CI-fast), and one case per policy end to end through
:func:`kvviz.eviction.run.run_policy`, whose evicting cache must then hold exactly that set.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache

from kvviz.capture.loop import forward, model_info
from kvviz.capture.recorder import Recorder, RecorderConfig, installed
from kvviz.eviction.policies import PolicyState, make_policy, n_kept_for
from kvviz.eviction.run import run_policy

DATA = Path(__file__).resolve().parents[1] / "data"
REFERENCE = json.loads((DATA / "kvpress_kept.json").read_text())
CASES = REFERENCE["cases"]
END_TO_END = [c for c in CASES if c["prompt"] == "needle_chat" and c["params"]["compression_ratio"] == 0.75]


def to_policy(press: str, params: dict):
    """kvpress press + parameters → the kvviz policy and ratio that mean the same thing."""
    if press == "StreamingLLMPress":
        return make_policy("streaming_llm", sinks=params["n_sink"]), params["compression_ratio"]
    if press == "SnapKVPress":
        return (
            make_policy("snapkv", window_size=params["window_size"], kernel_size=params["kernel_size"], pooling="avg"),
            params["compression_ratio"],
        )
    raise AssertionError(f"no kvviz policy mapped to {press}")


def expand(runs: list[list[int]]) -> list[int]:
    """Half-open [start, stop) runs → sorted positions."""
    return [p for start, stop in runs for p in range(start, stop)]


def diff_heads(ours: list[list[list[int]]], theirs: list[list[list[int]]]) -> list[tuple]:
    """(layer, KV head, positions only kvviz keeps, positions only kvpress keeps) where they differ."""
    assert len(ours) == len(theirs) and all(len(a) == len(b) for a, b in zip(ours, theirs))
    return [
        (layer, head, sorted(set(a) - set(b)), sorted(set(b) - set(a)))
        for layer, (la, lb) in enumerate(zip(ours, theirs))
        for head, (a, b) in enumerate(zip(la, lb))
        if a != b
    ]


def reference_kept(case: dict) -> list[list[list[int]]]:
    return [[expand(head) for head in layer] for layer in case["kept"]]


@pytest.fixture(scope="module")
def prefills(lm):
    """Prompt name → (n tokens, window_rows [Lyr, Hq, W, L]) from one recorded fp32 prefill.

    W is the largest SnapKV window among the prompt's cases; a smaller window reads its last rows.
    """
    assert lm.dtype == torch.float32, "parity is defined for fp32 (the bundled model on CPU)"
    info = model_info(lm)
    out = {}
    for name, prompt in REFERENCE["prompts"].items():
        ids = prompt["token_ids"]
        window = max(
            [c["params"]["window_size"] for c in CASES if c["prompt"] == name and c["press"] == "SnapKVPress"],
            default=1,
        )
        rec = Recorder(
            info.layers,
            info.q_heads,
            len(ids),
            len(ids),
            RecorderConfig(obs_window=window, bin_factor=len(ids)),
            lm.device,
        )
        rec.cache = DynamicCache(config=lm.config)
        rec.phase, rec.t_total = "prefill", len(ids)
        with torch.inference_mode(), installed(lm.model):
            forward(lm, ids, 0, rec.cache, rec)
        out[name] = (len(ids), rec.window_rows)
    return out


def case_id(case: dict) -> str:
    params = "-".join(f"{k}={v}" for k, v in case["params"].items())
    return f"{case['prompt']}-{case['press']}-{params}"


def test_reference_uses_the_committed_prompts():
    """The reference was recorded on exactly the token ids in kvpress_prompts.json (rebuild both together)."""
    prompts = json.loads((DATA / "kvpress_prompts.json").read_text())["prompts"]
    assert {k: v["token_ids"] for k, v in REFERENCE["prompts"].items()} == {
        k: v["token_ids"] for k, v in prompts.items()
    }
    assert {c["press"] for c in CASES} == {"StreamingLLMPress", "SnapKVPress"}


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_kept_sets_equal_kvpress(prefills, case):
    n, window_rows = prefills[case["prompt"]]
    assert n == case["n_tokens"]
    policy, ratio = to_policy(case["press"], case["params"])
    n_kept = n_kept_for(n, ratio=ratio)
    assert n_kept == case["n_kept"], "n_kept = max(1, int(L × (1 − r))) differs from kvpress's"
    policy.validate(n_kept, n)
    layers, kv_heads = len(case["kept"]), len(case["kept"][0])
    state = PolicyState(
        positions=torch.arange(n).expand(layers, kv_heads, n),
        n_kept=n_kept,
        n_prompt=n,
        step=0,
        kv_heads=kv_heads,
        window_rows=window_rows,
    )
    assert policy.wants_compression(state)
    keep = policy.select(state).keep  # [Lyr, Hkv, n_kept]
    diffs = diff_heads(keep.tolist(), reference_kept(case))
    assert not diffs, (
        f"{len(diffs)} (layer, KV head) kept sets differ from kvpress "
        f"(layer, head, only kvviz keeps, only kvpress keeps): {diffs[:5]}"
    )


@pytest.mark.parametrize("case", END_TO_END, ids=[case_id(c) for c in END_TO_END])
def test_evicting_cache_holds_the_kvpress_set(lm, case):
    """Through run_policy: the cache that really shrinks holds kvpress's positions and only those."""
    ids = REFERENCE["prompts"][case["prompt"]]["token_ids"]
    policy, ratio = to_policy(case["press"], case["params"])
    run = run_policy(lm, ids, policy, ratio=ratio, max_new_tokens=1, record_history=False)
    assert run.n_kept == case["n_kept"]
    assert run.kept.shape == (len(case["kept"]), len(case["kept"][0]), case["n_kept"])
    diffs = diff_heads(run.kept_lists(), reference_kept(case))
    assert not diffs, f"{len(diffs)} (layer, KV head) kept sets differ from kvpress: {diffs[:5]}"
    assert run.step_bytes[0] == run.kv_bytes_per_token * case["n_kept"]
