"""One model for everyone: it stays read-only through every endpoint, and model work goes through one queue."""

from __future__ import annotations

import contextlib
import hashlib

import torch
from gradio_client import Client

from kvviz.capture.recorder import is_installed
from tests.api.bad_inputs import VALID_EXAMPLES

QUICK = {"max_new_tokens": 2}  # keep every endpoint's generation short


def fingerprint(model: torch.nn.Module) -> str:
    """A hash of every parameter and buffer's bytes, plus the settings a run could flip."""
    h = hashlib.sha256()
    with torch.no_grad():
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            h.update(name.encode())
            h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    h.update(repr((model.training, model.config._attn_implementation, model.config.use_cache)).encode())
    return h.hexdigest()


def test_the_shared_model_is_never_changed_by_any_endpoint(inprocess_app):
    lm = inprocess_app.ctx.lm
    before = fingerprint(lm.model)
    client = Client(inprocess_app.url, verbose=False)
    api = client.view_api(return_format="dict", print_info=False)["named_endpoints"]
    client.predict("The capital of France is", 3, False, 0.7, 0.9, 7, api_name="/generate")  # sampled, too
    for name, params in api.items():
        if name == "/generate":
            continue
        values = [QUICK[p["parameter_name"]] if p["parameter_name"] in QUICK
                  else p["parameter_default"] if p.get("parameter_has_default")
                  else VALID_EXAMPLES.get(p["parameter_name"], p.get("example_input")) for p in params["parameters"]]
        with contextlib.suppress(Exception):  # this test is about the model, not about these inputs
            client.predict(*values, api_name=name)
    assert fingerprint(lm.model) == before
    assert not is_installed(lm.model)
    assert all(not p.requires_grad for p in lm.model.parameters())


def test_model_work_is_queued_with_the_configured_limit(inprocess_app):
    demo, settings = inprocess_app.demo, inprocess_app.ctx.settings
    model_fns = [f for f in demo.fns.values() if f.concurrency_id == "model"]
    assert {f.name for f in model_fns} >= {"run", "api_generate"}
    for f in model_fns:
        assert f.queue, f"{f.name} bypasses the queue"
        assert f.concurrency_limit in (settings.concurrency, "default"), f"{f.name}: {f.concurrency_limit}"
    assert demo.max_threads >= settings.concurrency
    run = next(f for f in model_fns if f.name == "run")
    assert run.show_progress == "full"  # the page shows queue position, then the streamed progress
