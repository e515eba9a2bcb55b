"""A model dispatched by accelerate (``device_map``) gives every result the whole model on one device gives.

On this CPU-only machine accelerate's dispatch has two places: the CPU and disk. A 300 MB ceiling
for the CPU puts SmolLM2's first layers there and offloads the rest to a folder on disk, whose
weights are loaded for each forward by accelerate's hooks. Capture (verified), eviction and the
memory gauge's numbers must come out exactly as on the undispatched model.
"""

from __future__ import annotations

import argparse

import numpy as np
import pytest
import torch

from kvviz.capture.loop import capture
from kvviz.capture.model_io import encode_prompt, model_info
from kvviz.capture.trace import _ARRAYS
from kvviz.commands.common import add_placement_args, placement
from kvviz.eviction.policies import make_policy
from kvviz.eviction.run import run_policy
from kvviz.models import ModelLoadError, load_model, parse_max_memory
from kvviz.ui.generate.tab import room_for_tokens

PROMPT = "The key-value cache stores what attention has already computed, so"


@pytest.fixture(scope="module")
def dispatched(tmp_path_factory):
    return load_model(
        device_map="auto", max_memory={"cpu": "300MB"}, offload_folder=str(tmp_path_factory.mktemp("offload"))
    )


def test_part_of_the_model_is_offloaded_to_disk(dispatched):
    places = set(dispatched.device_map.values())
    assert places == {"cpu", "disk"}, dispatched.device_map
    assert any(p.device.type == "meta" for p in dispatched.model.parameters())  # disk weights load per forward
    assert dispatched.device == torch.device("cpu")


def test_capture_on_the_dispatched_model_equals_the_whole_model(lm, dispatched):
    whole = capture(lm, PROMPT, chat=False, max_new_tokens=8, verify=True)
    spread = capture(dispatched, PROMPT, chat=False, max_new_tokens=8, verify=True)
    assert spread.token_ids == whole.token_ids and spread.text == whole.text
    assert [s.layer_bytes for s in spread.steps] == [s.layer_bytes for s in whole.steps]
    for name in _ARRAYS:
        a, b = getattr(whole, name), getattr(spread, name)
        assert (a is None) == (b is None), name
        if a is not None:
            np.testing.assert_array_equal(b, a, err_msg=name)
    assert spread.equivalence["max_abs_logit_diff"] < 1e-3
    assert spread.equivalence["max_abs_logit_diff_vs_unpatched"] < 1e-3
    assert set(dispatched.model.hf_device_map.values()) == {"cpu", "disk"}  # the capture moved nothing


def test_eviction_on_the_dispatched_model_equals_the_whole_model(lm, dispatched):
    ids = encode_prompt(lm, PROMPT, chat=False)
    whole = run_policy(lm, ids, make_policy("h2o"), budget=8, max_new_tokens=6)
    spread = run_policy(dispatched, ids, make_policy("h2o"), budget=8, max_new_tokens=6)
    assert spread.generated_ids == whole.generated_ids
    assert spread.kept_lists() == whole.kept_lists() and spread.step_bytes == whole.step_bytes


def test_the_memory_numbers_count_offloaded_weights_too(lm, dispatched):
    a, b = model_info(lm), model_info(dispatched)
    assert (b.param_count, b.weight_bytes, b.kv_bytes_per_token) == (
        a.param_count,
        a.weight_bytes,
        a.kv_bytes_per_token,
    )
    assert room_for_tokens(dispatched, 16e9, b.weight_bytes) == room_for_tokens(lm, 16e9, a.weight_bytes)


def test_placement_flags():
    p = argparse.ArgumentParser()
    add_placement_args(p)
    args = p.parse_args(["--device-map", "auto", "--max-memory", "0=20GiB,cpu=60GiB", "--offload-folder", "off"])
    assert placement(args) == {
        "device_map": "auto",
        "max_memory": {0: "20GiB", "cpu": "60GiB"},
        "offload_folder": "off",
    }
    assert placement(p.parse_args([])) == {}
    with pytest.raises(ModelLoadError, match="need --device-map"):
        placement(p.parse_args(["--max-memory", "cpu=1GiB"]))
    with pytest.raises(ModelLoadError, match="device=size"):
        parse_max_memory("20GiB")
    with pytest.raises(ModelLoadError, match="not both"):
        load_model(device="cpu", device_map="auto")
