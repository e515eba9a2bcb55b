"""kvviz's policies keep exactly what NVIDIA kvpress 0.5.5 keeps, per layer and KV head.

The reference, tests/data/kvpress_kept.json, was recorded by kvpress's own presses (StreamingLLM,
SnapKV, Knorm, TOVA, ExpectedAttention, PyramidKV, AdaKV around SnapKV, KVzip) on the bundled SmolLM2
(fp32, exact attention) in a separate env — see tools/kvpress_reference.py for how to rebuild it.
Here kvviz must keep the same positions for the same token ids and compression ratio: every case
through the policy's ``select`` on one recorded prefill per prompt (kept CI-fast), and one case per
policy end to end through :func:`kvviz.eviction.run.run_policy`, whose evicting cache must then
hold exactly that set (and, for ragged budgets, the bytes of exactly those entries). KVzip's cases run
its context-reconstruction pass (:mod:`kvviz.eviction.reconstruction`) on a plain prefill of the prompt
and must also feed exactly the repeat prompts kvpress fed.
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache

from kvviz.capture.attention_fn import installed
from kvviz.capture.model_io import forward, model_info
from kvviz.capture.recorder import Recorder, RecorderConfig
from kvviz.eviction.policies import PolicyState, make_policy, n_kept_for
from kvviz.eviction.query_stats import collecting
from kvviz.eviction.reconstruction import reconstruction_scores, repeat_chunks
from kvviz.eviction.run import run_policy

pytestmark = pytest.mark.slow  # a recorded prefill per prompt, and end-to-end runs

DATA = Path(__file__).resolve().parents[1] / "data"
REFERENCE = json.loads((DATA / "kvpress_kept.json").read_text())
CASES = REFERENCE["cases"]
PRESS_POLICY = {
    "StreamingLLMPress": "streaming_llm",
    "SnapKVPress": "snapkv",
    "KnormPress": "knorm",
    "TOVAPress": "tova",
    "ExpectedAttentionPress": "expected_attention",
    "PyramidKVPress": "pyramidkv",
    "AdaKVPress": "adakv",
    "KVzipPress": "kvzip",
}
END_TO_END = [
    next(
        c
        for c in CASES
        if c["press"] == press
        and c["prompt"] == "needle_chat"
        and c["params"]["compression_ratio"] in (0.5, 0.75)
        and c["params"].get("beta", 2) != 20
    )
    for press in PRESS_POLICY
]


def to_policy(press: str, params: dict):
    """kvpress press + parameters → the kvviz policy and ratio that mean the same thing."""
    if press not in PRESS_POLICY:
        raise AssertionError(f"no kvviz policy mapped to {press}")
    name = PRESS_POLICY[press]
    renamed = {"n_sink": "sinks"} if press == "StreamingLLMPress" else {}  # kvpress's name → kvviz's
    own = {renamed.get(k, k): v for k, v in params.items() if k != "compression_ratio"}  # the ratio is the budget
    return make_policy(name, **own), params["compression_ratio"]


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


def is_tie(scores: torch.Tensor | None, diff: tuple, rtol: float = 1e-5) -> bool:
    """Whether a differing head only swaps entries of equal score at the budget's edge.

    The same token at two positions has keys of exactly equal norm in layer 0 (RoPE is a rotation), so
    which of them a top-k keeps is decided by float rounding, which differs between CPUs.
    """
    layer, head, only_ours, only_theirs = diff
    if scores is None or len(only_ours) != len(only_theirs):
        return False
    swapped = scores[layer, head, only_ours + only_theirs].double()
    if not bool(torch.isfinite(swapped).all()):
        return False
    spread = float(swapped.max() - swapped.min())
    return spread <= rtol * float(swapped.abs().max())


def from_mask(mask: str) -> list[int]:
    """A hexadecimal bit mask (bit p set = position p kept) → sorted positions."""
    bits = int(mask, 16)
    return [p for p in range(bits.bit_length()) if bits >> p & 1]


def reference_kept(case: dict) -> list[list[list[int]]]:
    if "kept_mask" in case:
        return [[from_mask(head) for head in layer] for layer in case["kept_mask"]]
    return [[expand(head) for head in layer] for layer in case["kept"]]


def kvzip_scores(lm, ids: list[int], cases: list[dict]) -> dict[tuple[int, int], torch.Tensor]:
    """(n_sink, chunk_size) → KVzip's reconstruction scores [Lyr, Hkv, L], on a plain fp32 prefill of ``ids``."""
    cache = DynamicCache(config=lm.config)
    with torch.inference_mode(), installed(lm.model):
        forward(lm, ids, 0, cache, None)
    keys = torch.stack([layer.keys[0] for layer in cache.layers])
    values = torch.stack([layer.values[0] for layer in cache.layers])
    out = {}
    for c in cases:
        policy, _ = to_policy(c["press"], c["params"])
        repeat = policy.reconstruction_pass
        if repeat not in out:
            out[repeat] = reconstruction_scores(lm, keys, values, ids, *repeat).scores
    return out


@pytest.fixture(scope="module")
def prefills(lm):
    """Prompt name → what every policy may look at after one recorded fp32 prefill: n tokens, window_rows
    [Lyr, Hq, W, L], keys and values [Lyr, Hkv, L, D], the query statistics for each n_sink in the cases, and
    KVzip's reconstruction scores for each (n_sink, chunk_size) in the cases.

    W is the largest SnapKV window among the prompt's cases; a smaller window reads its last rows.
    """
    assert lm.dtype == torch.float32, "parity is defined for fp32 (the bundled model on CPU)"
    info = model_info(lm)
    out = {}
    for name, prompt in REFERENCE["prompts"].items():
        ids = prompt["token_ids"]
        mine = [c for c in CASES if c["prompt"] == name]
        window = max([c["params"].get("window_size", 1) for c in mine], default=1)
        skips = sorted({c["params"].get("n_sink", 4) for c in mine if c["press"] == "ExpectedAttentionPress"})
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
        with torch.inference_mode(), installed(lm.model), ExitStack() as stack:
            gets = {skip: stack.enter_context(collecting(lm.model, skip, [len(ids)])) for skip in skips}
            forward(lm, ids, 0, rec.cache, rec)
            stats = {skip: get(len(ids)) for skip, get in gets.items()}
        keys = torch.stack([layer.keys[0] for layer in rec.cache.layers])
        values = torch.stack([layer.values[0] for layer in rec.cache.layers])
        kvzip = kvzip_scores(lm, ids, [c for c in mine if c["press"] == "KVzipPress"])
        out[name] = (len(ids), rec.window_rows, keys, values, stats, kvzip)
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
    assert {c["press"] for c in CASES} == set(PRESS_POLICY)
    for press in PRESS_POLICY:  # two prompts, three settings or more on each
        for name in prompts:
            assert len([c for c in CASES if c["press"] == press and c["prompt"] == name]) >= 3, (press, name)


def expected_n_kept(policy, case: dict, n: int, layers: int) -> list[int]:
    """Entries per KV head each layer keeps: uniform, or PyramidKV's per-layer budgets."""
    ratio = case["params"]["compression_ratio"]
    if case["press"] == "PyramidKVPress":
        return policy.budgets(n, n_kept_for(n, ratio=ratio), layers, ratio)
    return [n_kept_for(n, ratio=ratio)] * layers


KVZIP = [c for c in CASES if c["press"] == "KVzipPress"]


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_kept_sets_equal_kvpress(prefills, case):
    n, window_rows, keys, values, stats, kvzip = prefills[case["prompt"]]
    assert n == case["n_tokens"]
    policy, ratio = to_policy(case["press"], case["params"])
    n_kept = n_kept_for(n, ratio=ratio)
    reference = reference_kept(case)
    layers, kv_heads = len(reference), len(reference[0])
    if case["press"] == "KVzipPress":  # one budget over every layer and head: kvpress's total
        assert sum(map(len, (h for layer in reference for h in layer))) == case["n_kept_total"]
    else:
        per_layer = case.get("n_kept_per_layer") or [case["n_kept"]] * layers
        assert expected_n_kept(policy, case, n, layers) == per_layer, "budgets differ from kvpress's"
    policy.validate(n_kept, n)
    state = PolicyState(
        positions=torch.arange(n).expand(layers, kv_heads, n),
        n_kept=n_kept,
        n_prompt=n,
        step=0,
        kv_heads=kv_heads,
        window_rows=window_rows,
        keys=keys,
        values=values,
        query_stats=stats.get(policy.query_stats_skip),
        ratio=ratio,
        reconstruction=kvzip.get(policy.reconstruction_pass),
    )
    assert policy.wants_compression(state)
    selection = policy.select(state)
    keep = selection.keep  # [Lyr, Hkv, k], PAD after each head's list when budgets differ
    ours = [[sorted(p for p in head if p >= 0) for head in layer] for layer in keep.tolist()]
    diffs = [d for d in diff_heads(ours, reference) if not is_tie(selection.scores, d)]
    assert not diffs, (
        f"{len(diffs)} (layer, KV head) kept sets differ from kvpress "
        f"(layer, head, only kvviz keeps, only kvpress keeps): {diffs[:5]}"
    )


@pytest.mark.parametrize("case", KVZIP, ids=[case_id(c) for c in KVZIP])
def test_kvzip_repeats_what_kvpress_repeats(lm, case):
    """The chat template's header and every repeat pass's prompt (the ids before the repeated context) are
    kvpress's, chunk by chunk."""
    ids = REFERENCE["prompts"][case["prompt"]]["token_ids"]
    header, chunks = repeat_chunks(lm.tokenizer, ids, case["params"].get("chunk_size", 2048))
    assert header == case["header"]
    assert [[c.start, len(c.ids) - (c.end - c.start), c.ids[: len(c.ids) - (c.end - c.start)]] for c in chunks] == case[
        "repeat_chunks"
    ]
    assert chunks[-1].end == len(ids) and all(c.ids[-(c.end - c.start) :] == ids[c.start : c.end] for c in chunks)


@pytest.mark.parametrize("case", END_TO_END, ids=[case_id(c) for c in END_TO_END])
def test_evicting_cache_holds_the_kvpress_set(lm, case):
    """Through run_policy: the cache that really shrinks holds kvpress's positions and only those."""
    ids = REFERENCE["prompts"][case["prompt"]]["token_ids"]
    policy, ratio = to_policy(case["press"], case["params"])
    run = run_policy(lm, ids, policy, ratio=ratio, max_new_tokens=1, record_history=False)
    reference = reference_kept(case)
    assert run.n_kept == n_kept_for(len(ids), ratio=ratio)
    assert run.kept.shape[:2] == (len(reference), len(reference[0]))
    diffs = diff_heads(run.kept_lists(), reference)
    assert not diffs, f"{len(diffs)} (layer, KV head) kept sets differ from kvpress: {diffs[:5]}"
    entries = sum(len(head) for layer in reference for head in layer)
    per_entry = run.kv_bytes_per_token // (len(reference) * len(reference[0]))  # one layer and KV head
    assert run.held_bytes == entries * per_entry
    padded = sum(max(len(head) for head in layer) for layer in reference) * len(reference[0]) * per_entry
    assert run.step_bytes[0] == padded  # each layer stored as long as its fullest head


def test_only_equal_scores_count_as_a_tie():
    """A swap of equal-score entries is a tie; any other difference is still a difference."""
    scores = torch.tensor([[[-1.0, -2.0, -2.0 * (1 + 1e-7), -3.0]]])
    assert is_tie(scores, (0, 0, [1], [2]))
    assert not is_tie(scores, (0, 0, [1], [3]))
    assert not is_tie(scores, (0, 0, [1], [2, 3]))  # not a one-for-one swap
    assert not is_tie(None, (0, 0, [1], [2]))
