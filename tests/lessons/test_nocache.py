"""Cache vs no cache on the real model: identical tokens, counted passes, the article's table."""

from __future__ import annotations

import pytest

from kvviz.lessons.nocache import chapter_example, compare_cache, redundant_work_table, table_for_prompt
from kvviz.lessons.waste import forward_passes

ARTICLE = [  # the source article's "Repeated work without a cache" table
    (1, "Once upon a time", "K/V for tokens 1–4", "None"),
    (2, "Once upon a time there", "K/V for tokens 1–5", "Tokens 1–4"),
    (3, "Once upon a time there lived", "K/V for tokens 1–6", "Tokens 1–5"),
    (4, "Once upon a time there lived a", "K/V for tokens 1–7", "Tokens 1–6"),
]


@pytest.mark.parametrize(
    "prompt,chat,n", [("Once upon a time", False, 10), ("What is the capital of France?", True, 4)]
)
def test_no_cache_generates_exactly_the_cached_tokens(lm, prompt, chat, n):
    cmp = compare_cache(lm, prompt, new_tokens=n, chat=chat)
    assert len(cmp.cached.token_ids) == n
    assert cmp.cached.token_ids == cmp.uncached.token_ids
    assert cmp.same_tokens
    fp = forward_passes(cmp.prompt_tokens, n)
    assert cmp.cached.cumulative_passes[-1] == fp.with_cache
    assert cmp.uncached.cumulative_passes[-1] == fp.without_cache
    assert cmp.uncached.step_passes == [cmp.prompt_tokens + i for i in range(n)]
    df = cmp.frame()
    assert list(df["passes without cache"]) == list(df["formula without cache (NL + N(N−1)/2)"])
    assert (df["time without cache (s)"] > 0).all()


def test_the_articles_table_with_the_real_tokenizer(lm):
    ids = lm.tokenizer("Once upon a time there lived a")["input_ids"]
    tokens = [lm.tokenizer.decode([i]) for i in ids]
    assert len(tokens) == 7  # one token per word, as the article counts them
    df = redundant_work_table(tokens, n_prompt=4)
    got = list(
        df[["Step", "Input sequence", "Keys and Values computed", "Redundant work"]].itertuples(index=False, name=None)
    )
    assert got == ARTICLE
    assert list(df["redundant (tokens)"]) == [0, 4, 5, 6]
    assert list(df["With a KV cache"])[1:] == ["K/V for token 5 only", "K/V for token 6 only", "K/V for token 7 only"]


def test_table_for_the_users_prompt_uses_the_models_continuation(lm):
    df = table_for_prompt(lm, "Once upon a time", steps=4)
    assert list(df["Step"]) == [1, 2, 3, 4]
    assert df["Input sequence"][0] == "Once upon a time"
    assert all(df["Input sequence"][i + 1].startswith(df["Input sequence"][i]) for i in range(3))
    assert list(df["K/V computed (tokens)"]) == [4, 5, 6, 7]
    with pytest.raises(ValueError):
        table_for_prompt(lm, "Once upon a time", steps=0)


def test_the_chapters_example():
    ex = chapter_example()
    assert ex["without_cache"] == sum(range(1000, 2001)) == 1_501_500  # ≈ 1.5 million
    assert ex["with_cache"] == 2000
    assert int(ex["ratio"]) == 750  # "a 750× waste"


def test_bad_input():
    with pytest.raises(ValueError):
        redundant_work_table(["a", "b"], n_prompt=3)
    with pytest.raises(ValueError):
        redundant_work_table(["a", "b"], n_prompt=1, steps=3)
