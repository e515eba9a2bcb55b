"""The eviction analyses on the bundled model: the needle demo, the side-by-side metrics, the sinks demo.

The needle demo's budget (256 of the 496-token prompt, kvviz.eviction.demos.NEEDLE_BUDGET) was tuned on
SmolLM2-135M-Instruct in fp32: SnapKV with the question finds 4721 from about 240 to 288 kept tokens
(below that it keeps only part of the code, e.g. "421"), without the question it loses it up to
about 272, and StreamingLLM needs 321 or more to keep the fact (position 179). 256 sits inside
that window with a margin of 16 on each side.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvviz.capture.model_io import encode_prompt
from kvviz.eviction.compare import agreement_and_kl, compare
from kvviz.eviction.demos import NEEDLE_BUDGET, needle_demo, sinks_demo, split_question, streaming_nll
from kvviz.eviction.policies import make_policy
from kvviz.eviction.run import run_policy
from kvviz.examples import NEEDLE_ANSWER, chapter_text, needle_passage


@pytest.fixture(scope="module")
def needle(lm):
    return needle_demo(lm, compress_question=True)


@pytest.mark.slow
def test_needle_full_and_snapkv_with_the_question_answer_streaming_does_not(needle):
    found = needle.found()
    assert found == {"full": True, "streaming_llm": False, "snapkv": True}
    snap = next(r for r in needle.comparison.results if r.policy.name == "snapkv")
    assert snap.run.n_kept == NEEDLE_BUDGET and snap.run.n_compressed == snap.run.n_prompt == 496


@pytest.mark.slow
def test_needle_snapkv_loses_the_fact_when_only_the_context_is_compressed(lm, needle):
    ids, n_context = split_question(
        lm, needle_passage(8, 16), "Question: What is the secret code for the storage room?", True
    )
    assert n_context == needle.n_context and ids == needle.comparison.full.prompt_ids
    run = run_policy(lm, ids, make_policy("snapkv"), budget=NEEDLE_BUDGET, n_compress=n_context, max_new_tokens=14)
    assert NEEDLE_ANSWER not in run.text
    # the question was fed uncompressed: every head still holds all of it at the end
    question = set(range(n_context, len(ids)))
    assert all(question <= set(h.tolist()) for layer in run.history[-1] for h in layer)


@pytest.mark.slow
def test_needle_metrics_say_what_the_answers_say(needle):
    rows = {r["policy"]: r for r in needle.comparison.summary()["rows"]}
    assert rows["full"]["top1_agreement"] == 1.0 and rows["full"]["mean_kl_nats"] == 0.0
    assert rows["streaming_llm"]["top1_agreement"] < 1.0 and rows["streaming_llm"]["mean_kl_nats"] > 0.1
    assert rows["snapkv"]["mean_kl_nats"] < rows["streaming_llm"]["mean_kl_nats"]
    for name in ("streaming_llm", "snapkv"):
        assert rows[name]["cache_bytes"] < rows[name]["full_cache_bytes"]


def test_split_question_puts_the_chat_prefix_in_the_context(lm):
    ids, n = split_question(lm, "The sky is blue.", "Question: What colour is the sky?", True)
    assert lm.tokenizer.decode(ids[:n]).endswith("The sky is blue.")
    assert lm.tokenizer.decode(ids[n:]).startswith("\n\nQuestion:")
    assert split_question(lm, "Hello there", "", False)[1] == len(encode_prompt(lm, "Hello there", False))


def test_agreement_and_kl_by_hand():
    p = np.log(np.array([[0.7, 0.2, 0.1], [0.5, 0.25, 0.25]]))
    q = np.log(np.array([[0.7, 0.2, 0.1], [0.2, 0.6, 0.2]]))
    agree, kl = agreement_and_kl(p, q)
    assert agree.tolist() == [True, False]
    assert kl[0] == pytest.approx(0.0, abs=1e-12)
    assert kl[1] == pytest.approx(0.5 * np.log(0.5 / 0.2) + 0.25 * np.log(0.25 / 0.6) + 0.25 * np.log(0.25 / 0.2))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_compress": 0}, "between 1 and the prompt length"),
        ({"n_compress": 9}, "between 1 and the prompt length"),
        ({"max_new_tokens": 0}, "max_new_tokens must be a whole number"),
        ({"max_new_tokens": 2.5}, "max_new_tokens must be a whole number"),
        ({"max_new_tokens": 10**6}, "exceeds the model's context"),
    ],
)
def test_run_policy_refuses_what_its_generation_refuses(lm, kwargs, message):
    """The prompt's, the budget's and the context's checks are the generation's own, made before any forward."""
    with pytest.raises(ValueError, match=message):
        run_policy(lm, list(range(1, 9)), make_policy("full"), **kwargs)


@pytest.mark.slow
def test_a_budget_above_the_prompt_matches_the_full_cache(lm):
    ids = encode_prompt(lm, "Name the planets of the solar system.", True)
    cmp = compare(
        lm, ids, [make_policy("streaming_llm"), make_policy("window")], budget=len(ids) + 64, max_new_tokens=8
    )
    for r in cmp.results:
        assert r.top1_agreement == 1.0 and r.mean_kl < 1e-6 and r.run.text == cmp.full.text


@pytest.mark.slow
@pytest.mark.parametrize(("name", "sinks"), [("streaming_llm", 4), ("window", 0)])
def test_chunked_streaming_equals_token_by_token_decoding(lm, name, sinks):
    """The sinks demo's chunked masks give exactly what the evicting cache gives one token at a time."""
    ids = lm.tokenizer(chapter_text())["input_ids"][:40]
    chunked = streaming_nll(lm, ids, 12, sinks, chunk=16)
    p = 8  # the prompt fits the cache; everything after it is fed (teacher-forced) one token at a time
    run = run_policy(
        lm,
        ids[:p],
        make_policy(name),
        budget=12,
        forced=ids[p:],
        max_new_tokens=len(ids) - p,
        keep_logprobs=True,
        record_history=False,
    )
    token_by_token = -run.logprobs[np.arange(len(ids) - p), ids[p:]]
    np.testing.assert_allclose(chunked[p - 1 :], token_by_token, atol=1e-3)


@pytest.mark.slow
def test_sinks_matter_on_the_chapter(lm):
    res = sinks_demo(lm, n_tokens=192, cache_size=24)
    ppl = res.perplexity
    full, with_sinks, without = ppl["full cache"], ppl["4 sinks + 20 recent"], ppl["24 recent, no sinks"]
    assert full < with_sinks < without
    assert without > 2 * with_sinks, ppl  # quality collapses without the first tokens
    assert list(res.frame.columns) == ["position", "full cache", "4 sinks + 20 recent", "24 recent, no sinks"]
    assert len(res.frame) == 191
