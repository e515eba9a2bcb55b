"""The first-divergence finder on the real bundled model: every fault of the zoo injected at a known step
and layer is found exactly there (step, layer, position, and what left its tolerance first); with no
fault nothing diverges; unknown faults and out-of-range numbers are refused by name."""

from __future__ import annotations

import pytest
import torch

from kvviz.capture.attention_fn import is_installed
from kvviz.capture.divergence import OFF_SCALE, debug
from kvviz.capture.faults import BLOCK, FAULTS, check_fault, make_fault
from kvviz.capture.generation import Generation
from kvviz.capture.options import CacheSetup, Recording
from kvviz.capture.tolerance import divergence_tolerance

pytestmark = pytest.mark.slow  # a run and a recomputation of the real model per fault

PROMPT = "Why is the sky blue? Explain it in one short paragraph for a curious child."
NEW = 6
DECODE = [n for n, f in FAULTS.items() if not f.prefill and n != "sliding_window_off_by_one"]


@pytest.mark.parametrize("name", DECODE)
@pytest.mark.parametrize(("step", "layer"), [(3, 5), (1, 0), (4, 29)])
def test_each_decode_fault_is_found_at_its_step_and_layer(lm, name, step, layer):
    report = debug(lm, PROMPT, make_fault(name, step=step, layer=layer), max_new_tokens=NEW)
    f = report.first
    assert f is not None, name
    assert (f.step, f.layer, f.position) == (step, layer, report.n_prompt + step - 1), name
    assert f.quantity == FAULTS[name].first, name
    assert not report.ratio[:step].any() or report.ratio[:step].max() <= 1  # all clear before it
    assert report.ratio[step, layer] > 1 and report.ratio[step, :layer].max(initial=0) <= 1
    assert not is_installed(lm.model)


def test_the_cache_length_faults_say_which_way(lm):
    short = debug(lm, PROMPT, make_fault("not_appended", step=2, layer=3), max_new_tokens=4).first
    long = debug(lm, PROMPT, make_fault("appended_twice", step=2, layer=3), max_new_tokens=4).first
    assert short is not None and long is not None
    assert (short.jump, long.jump) == (-1.0, 1.0)


def test_a_wrongly_mapped_prefix_block_is_found_at_its_first_position(lm):
    report = debug(lm, PROMPT, make_fault("prefix_block_off_by_one", block=2), max_new_tokens=3)
    f = report.first
    assert f is not None and (f.step, f.layer, f.position, f.quantity) == (0, 0, 2 * BLOCK, "K")


def test_a_fully_cached_prompt_stores_its_last_token_twice(lm):
    report = debug(lm, PROMPT, make_fault("fully_cached_prompt"), max_new_tokens=3)
    f = report.first
    assert report.n_prompt % BLOCK == 0 and report.notes  # cut to whole blocks, and said so
    assert f is not None and (f.step, f.layer, f.position, f.quantity) == (0, 0, report.n_prompt - 1, "cache length")
    assert report.ratio[0].min() == OFF_SCALE  # every layer: one table serves them all


def test_no_fault_is_all_clear_and_the_tokens_are_the_models(lm):
    report = debug(lm, PROMPT, None, max_new_tokens=NEW, clean=True)
    assert report.first is None and report.tokens_changed_from is None
    assert report.ratio.max() < 0.2 and report.logit_ratio.max() < 0.2  # far inside the tolerance
    assert report.token_ids == report.reference_ids and report.clean_tokens == report.tokens
    j = report.to_json()
    assert j["diverged"] is False and len(j["map"]) == NEW and len(j["map"][0]) == lm.config.num_hidden_layers


def test_a_fault_that_changes_the_tokens_says_from_which_step(lm):
    report = debug(lm, PROMPT, make_fault("causal_decode", step=1, layer=0), max_new_tokens=NEW, clean=True)
    assert report.tokens_changed_from is not None and report.tokens_changed_from >= 1
    assert report.tokens != report.clean_tokens


def test_tolerance_is_derived_from_the_dtype():
    assert divergence_tolerance(torch.float32) == pytest.approx(torch.finfo(torch.float32).eps ** 0.5)
    assert (
        divergence_tolerance(torch.float32) < divergence_tolerance(torch.float16) < divergence_tolerance(torch.bfloat16)
    )


def test_unknown_faults_and_numbers_out_of_range_are_refused_by_name(lm):
    with pytest.raises(ValueError, match="Unknown fault 'sinks_dropped'"):
        make_fault("sinks_dropped")
    with pytest.raises(ValueError, match="fault step"):
        make_fault("causal_decode", step=0)
    with pytest.raises(ValueError, match="fault step"):
        make_fault("causal_decode", step=10**9)
    with pytest.raises(ValueError, match="fault layer"):
        check_fault(make_fault("causal_decode", layer=30), 30, 8, False)
    with pytest.raises(ValueError, match="fault step"):
        check_fault(make_fault("causal_decode", step=8), 30, 8, False)
    with pytest.raises(ValueError, match="no sliding"):
        debug(lm, PROMPT, make_fault("sliding_window_off_by_one"), max_new_tokens=3)
    with pytest.raises(ValueError, match="record=False"):
        Generation(lm, PROMPT, cache=CacheSetup(fault=make_fault("causal_decode")))  # never beside the recorder


def test_a_fault_is_part_of_what_makes_a_run_unique(lm):
    a = Generation(
        lm, PROMPT, recording=Recording(on=False), cache=CacheSetup(fault=make_fault("causal_decode", step=2, layer=1))
    )
    b = Generation(
        lm, PROMPT, recording=Recording(on=False), cache=CacheSetup(fault=make_fault("causal_decode", step=2, layer=2))
    )
    assert a.key() != b.key()
