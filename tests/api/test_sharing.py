"""One model for everyone: it stays read-only through every endpoint, and model work goes through one queue."""

from __future__ import annotations

import contextlib
import hashlib

import torch
from gradio_client import Client

from kvviz.capture.attention_fn import is_installed
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
        values = [
            QUICK[p["parameter_name"]]
            if p["parameter_name"] in QUICK
            else p["parameter_default"]
            if p.get("parameter_has_default")
            else VALID_EXAMPLES.get(p["parameter_name"], p.get("example_input"))
            for p in params["parameters"]
        ]
        with contextlib.suppress(Exception):  # this test is about the model, not about these inputs
            client.predict(*values, api_name=name)
    assert fingerprint(lm.model) == before
    assert not is_installed(lm.model)
    assert all(not p.requires_grad for p in lm.model.parameters())


def test_model_handlers_wait_at_the_gate_not_in_a_gradio_group(inprocess_app):
    """The gate (kvviz/ui/serving/jobs.py) is the model's one queue: a Gradio limit on a model handler would make its
    checks and refusals wait behind running jobs, and too few workers would stall the whole queue."""
    demo, settings = inprocess_app.demo, inprocess_app.ctx.settings
    model_handlers = {
        "run",
        "api_generate",
        "evict",
        "run_compare",
        "run_compose",
        "run_needle",
        "run_sinks",
        "run_table",
        "run_measure",
        "run_analyze",
        "run_generate",
        "run_example",
        "run_own",
    }
    fns = {f.name: f for f in demo.fns.values() if f.name in model_handlers}
    assert set(fns) == model_handlers
    limited = [name for name, f in fns.items() if f.concurrency_limit is not None]
    assert not limited, f"model handlers with a Gradio concurrency limit: {limited}"
    assert demo.max_threads > settings.queue_size + settings.concurrency
    assert inprocess_app.ctx.jobs.gate.slots == settings.concurrency
