"""Show-me results on disk: a real trace comes back equal, and anything but a file this server wrote is refused."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest
import torch

from kvviz.capture.loop import capture
from kvviz.demo_files import DemoFiles, NotStorable, Unreadable
from kvviz.demo_store import DemoStore
from kvviz.settings import Settings
from kvviz.ui.serving import precompute

KEY = ("SmolLM2", "generate", (1, 2, 3), 4, 0.0, 1.0, 0)


@pytest.fixture(scope="module")
def trace(lm):
    return capture(lm, "Once upon a time", chat=False, max_new_tokens=3)


def files(tmp_path, version="v1") -> DemoFiles:
    return DemoFiles(tmp_path, "SmolLM2", version, where="test machine")


def test_a_real_trace_and_its_neighbours_come_back_equal(tmp_path, trace):
    fig = go.Figure(go.Bar(x=["a", "b"], y=[1.5, 2.5]), layout={"title": {"text": "t"}})
    table = pd.DataFrame({"layer": [0, 1], "bytes": [10.5, 20.0]})
    value = (trace, b"\x00npz bytes", {3: "int key", ("a", 1): {1.5}}, torch.ones(2, dtype=torch.bfloat16), fig, table)
    d = files(tmp_path)
    d.save(KEY, value, "generation", 1.25)
    back, head = d.load(KEY)
    t = back[0]
    assert type(t) is type(trace) and t.tokens == trace.tokens and t.token_ids == trace.token_ids
    assert t.steps == trace.steps and t.model == trace.model and t.text == trace.text
    np.testing.assert_array_equal(t.decode_rows, trace.decode_rows)
    np.testing.assert_array_equal(t.colsum, trace.colsum)
    assert back[1] == b"\x00npz bytes" and back[2] == {3: "int key", ("a", 1): {1.5}}
    assert back[3].dtype == torch.bfloat16 and torch.equal(back[3], value[3])
    assert back[4].to_dict() == fig.to_dict() and back[5].equals(table)
    assert head["label"] == "generation" and head["seconds"] == 1.25


def test_what_the_format_cannot_hold_is_not_written(tmp_path):
    with pytest.raises(NotStorable):
        files(tmp_path).save(KEY, {"f": open})
    with pytest.raises(NotStorable):
        files(tmp_path).save(KEY, SimpleNamespace(a=1))


def _rewrite(d: DemoFiles, change) -> None:
    """Edit the stored JSON as an attacker (or a crash) would, keeping the arrays' digest valid."""
    path = d.path(KEY)
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize(
    "change",
    [
        lambda doc: doc["value"]["$t"].__setitem__(0, {"$c": "os:system", "f": {}}),  # not a kvviz class
        lambda doc: doc["value"]["$t"].__setitem__(0, {"$c": "kvviz.settings:env", "f": {}}),  # not a dataclass
        lambda doc: doc["value"]["$t"].__setitem__(0, {"$eval": "1"}),  # an unknown tag
        lambda doc: doc.__setitem__("key", repr(("another",))),  # written for another key
        lambda doc: doc.__setitem__("machine", "another machine"),
        lambda doc: doc.__setitem__("runs_as", "bfloat16 on cpu"),  # the model in another dtype
        lambda doc: doc["value"]["$t"][0]["f"].pop("tokens"),  # the class's fields changed since
    ],
)
def test_a_foreign_or_edited_file_is_refused(tmp_path, trace, change):
    d = files(tmp_path)
    d.save(KEY, (trace, 1))
    _rewrite(d, change)
    with pytest.raises(Unreadable):
        d.load(KEY)


def test_a_pickled_or_truncated_array_file_and_broken_json_are_refused(tmp_path):
    d = files(tmp_path)
    d.save(KEY, np.arange(3))
    buf = io.BytesIO()
    np.savez(buf, a0=np.array([{"x": 1}], dtype=object))  # a pickle inside the npz
    d.path(KEY).with_suffix(".npz").write_bytes(buf.getvalue())
    with pytest.raises(Unreadable):  # not the arrays written with the JSON
        d.load(KEY)
    import hashlib

    _rewrite(d, lambda doc: doc.__setitem__("arrays", hashlib.sha256(buf.getvalue()).hexdigest()))
    with pytest.raises(Unreadable):  # digest matches now: np.load refuses the pickle
        d.load(KEY)
    d.path(KEY).write_text("{not json")
    with pytest.raises(Unreadable):
        d.load(KEY)
    assert files(tmp_path, "v2").load(KEY) is None  # another version has its own folder


def _ctx(tmp_path, store: DemoStore, dtype=torch.float32, device="cpu") -> SimpleNamespace:
    lm = SimpleNamespace(name="SmolLM2", dtype=dtype, device=torch.device(device))
    return SimpleNamespace(settings=Settings(results_dir=str(tmp_path)), lm=lm, store=store)


def test_a_restart_reads_back_what_the_first_start_computed_and_refreshes_it(tmp_path, monkeypatch):
    monkeypatch.setattr(precompute, "code_version", lambda: "v1")
    calls: list[int] = []

    def compute(report, should_stop):
        calls.append(1)
        return {"answer": len(calls), "rows": np.arange(4)}

    first = DemoStore()
    entry = first.plan(KEY, "demo", compute)
    assert precompute.restore(_ctx(tmp_path, first)) == 0
    first.claim(KEY)
    first.run(entry, "start-up")  # computed and written to disk (on_done)
    second = DemoStore()
    restored: list = []
    again = second.plan(KEY, "demo", compute, restored=restored.append)
    assert precompute.restore(_ctx(tmp_path, second)) == 1
    assert again.state == "done" and again.source == "stored" and again.stale and calls == [1]
    assert again.value["answer"] == 1 and restored and "earlier start" in precompute.origin(again)
    assert second.refresh(again) and again.value["answer"] == 2 and not again.stale and again.source == "start-up"
    third = DemoStore()
    newest = third.plan(KEY, "demo", compute)
    precompute.restore(_ctx(tmp_path, third))
    assert newest.value["answer"] == 2  # the refreshed value was written over the first


def test_a_stored_file_that_does_not_load_is_removed_and_computed_again(tmp_path, monkeypatch):
    monkeypatch.setattr(precompute, "code_version", lambda: "v1")
    first = DemoStore()
    entry = first.plan(KEY, "demo", lambda report, stop: 1)
    precompute.restore(_ctx(tmp_path, first))
    first.claim(KEY)
    first.run(entry, "start-up")
    path = precompute.disk(_ctx(tmp_path, first)).path(KEY)
    path.write_text("{broken")
    second = DemoStore()
    pending = second.plan(KEY, "demo", lambda report, stop: 2)
    assert precompute.restore(_ctx(tmp_path, second)) == 0
    assert pending.state == "pending" and not path.exists()


@pytest.mark.parametrize(("dtype", "device"), [(torch.bfloat16, "cpu"), (torch.float32, "cuda")])
def test_a_server_in_another_dtype_or_on_another_device_computes_its_own_results(tmp_path, monkeypatch, dtype, device):
    monkeypatch.setattr(precompute, "code_version", lambda: "v1")
    first = DemoStore()
    entry = first.plan(KEY, "demo", lambda report, stop: "fp32 on the CPU")
    precompute.restore(_ctx(tmp_path, first))
    first.claim(KEY)
    first.run(entry, "start-up")
    other = DemoStore()
    pending = other.plan(KEY, "demo", lambda report, stop: "its own")
    assert precompute.restore(_ctx(tmp_path, other, dtype, device)) == 0  # the fp32 CPU result is not read back
    assert pending.state == "pending"
    same = DemoStore()
    again = same.plan(KEY, "demo", lambda report, stop: "recomputed")
    assert precompute.restore(_ctx(tmp_path, same)) == 1 and again.value == "fp32 on the CPU"
