"""The solo driver: it feeds a Generation's plan forward by forward, produces what the library's own
greedy generation produces, and holds inference mode and the capture's wrapper only while it drives."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch

from kvviz.capture.attention_fn import is_installed
from kvviz.capture.drive import drive, forwards
from kvviz.capture.generation import Generation
from kvviz.capture.model_io import encode_prompt
from kvviz.capture.options import Decode, Feed, Recording

PROMPT = "Name the largest planet of the solar system."


def test_every_forward_of_the_plan_is_yielded_once(lm):
    ids = encode_prompt(lm, PROMPT, True)
    n, tail = len(ids), 3
    g = Generation(
        lm,
        "",
        feed=Feed(prompt_ids=ids, prefill_tokens=n - tail),
        decode=Decode(max_new_tokens=4, stop_on_eos=False),
        recording=Recording(on=False),
    )
    fs = list(forwards(lm, g, wrapped=False))
    assert [f.start for f in fs] == [0, n - 3, n - 2, n - 1, n, n + 1, n + 2]
    assert [len(f.feed) for f in fs] == [n - 3, 1, 1, 1, 1, 1, 1]
    assert [f.produced for f in fs] == [False, False, False, True, True, True, True]
    assert [f.decode for f in fs] == [False] * 4 + [True] * 3, "a decode step feeds a token the run produced"
    assert sum((f.feed for f in fs), []) == g.trace.token_ids[: g.fed] and g.done and len(g.trace.steps) == 4
    assert all(f.logits.shape == (1, lm.model.config.vocab_size) for f in fs)
    assert all(f.wall_s > 0 and f.cpu_s >= 0 for f in fs)


@pytest.mark.slow
@pytest.mark.parametrize("wrapped", [True, False], ids=["wrapped", "as-loaded"])
def test_a_greedy_run_produces_the_librarys_greedy_tokens(lm, wrapped):
    ids = encode_prompt(lm, PROMPT, True)
    g = drive(
        lm,
        Generation(
            lm,
            "",
            feed=Feed(prompt_ids=ids),
            decode=Decode(max_new_tokens=8, stop_on_eos=False),
            recording=Recording(on=wrapped),
        ),
        wrapped=wrapped,
    )
    x = torch.tensor([ids])
    with torch.inference_mode():
        ref = lm.model.generate(
            x, attention_mask=torch.ones_like(x), max_new_tokens=8, min_new_tokens=8, do_sample=False
        )
    assert g.trace.token_ids == ref[0].tolist()


@pytest.mark.parametrize("wrapped", [True, False])
def test_inference_mode_and_the_wrapper_last_as_long_as_the_drive(lm, wrapped):
    g = Generation(lm, PROMPT, decode=Decode(max_new_tokens=3, stop_on_eos=False), recording=Recording(on=wrapped))
    during = [(torch.is_inference_mode_enabled(), is_installed(lm.model)) for _ in forwards(lm, g, wrapped=wrapped)]
    assert during == [(True, wrapped)] * 3
    assert not torch.is_inference_mode_enabled() and not is_installed(lm.model)
    stopped = forwards(
        lm, Generation(lm, PROMPT, decode=Decode(max_new_tokens=3), recording=Recording(on=wrapped)), wrapped=wrapped
    )
    next(stopped)
    stopped.close()  # a caller that stops following the run mid-way
    assert not torch.is_inference_mode_enabled() and not is_installed(lm.model)


def test_around_encloses_each_forward_before_the_run_takes_its_logits(lm):
    seen: list[tuple[str, int]] = []

    @contextmanager
    def watch(g: Generation):
        seen.append(("enter", g.fed))
        yield
        seen.append(("exit", g.fed))  # the logits are back, the run has not taken them yet

    g = Generation(
        lm,
        PROMPT,
        feed=Feed(chat=False),
        decode=Decode(max_new_tokens=2, stop_on_eos=False),
        recording=Recording(on=False),
    )
    drive(lm, g, wrapped=False, around=watch)
    n = g.trace.n_prompt
    assert seen == [("enter", 0), ("exit", 0), ("enter", n), ("exit", n)]
