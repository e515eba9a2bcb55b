"""kvviz's ``gpu`` wrapper under the real ``spaces`` package (pinned in requirements-dev.txt), on the CPU.

Each call goes through the package's own code: ``/schedule`` on the fake device API (:mod:`tests.zerogpu.device_api`),
a forked worker that calls ``/allow``, arguments and results pickled across, ``/release`` at the end. The functions
called live in ``tests/zerogpu/harness.py``, in their own process (see ``conftest.py``).
"""

from __future__ import annotations

import time

import pytest

from kvviz.ui.serving.gpu import quota_message

pytestmark = pytest.mark.slow


def test_a_worker_is_reused_when_the_device_api_says_idle_and_forked_again_when_not(harness, api):
    api.idle = True
    first, second = harness.call("state")["value"], harness.call("state")["value"]
    assert first["pid"] != harness.pid  # the call ran in a worker, not in the main process
    assert second["pid"] == first["pid"] and second["n"] == first["n"] + 1  # its module state survived
    api.idle = False
    fresh = harness.call("state")["value"]
    assert fresh["pid"] != first["pid"] and fresh["n"] == 1  # a new fork starts from the main process's memory
    assert len(api.of("/schedule")) == 3 and len(api.of("/release")) == 3
    assert len(api.of("/allow")) == 2  # only a new worker asks to be allowed on the GPU


def test_an_error_raised_in_the_worker_reaches_the_caller_with_its_message(harness, api):
    """The package sends back only the class name of an exception that is not a gr.Error; kvviz's wrapper turns
    it into one inside the worker, so the visitor reads what went wrong."""
    out = harness.call("fail", "the cache has 12 entries, the policy kept 13")
    assert out["error"] == "Error", out
    assert "the cache has 12 entries, the policy kept 13" in out["message"], out
    out = harness.call("fail_value", "Top-p must lie in (0, 1]")
    assert "Top-p must lie in (0, 1]" in out["message"], out
    assert [c.params["fail"] for c in api.of("/release")] == ["true", "true"]


def test_streamed_items_come_back_in_order_from_one_worker(harness, api):
    items = harness.call("count_to", 5)["value"]
    assert [i["i"] for i in items] == [0, 1, 2, 3, 4]
    assert len({i["pid"] for i in items}) == 1 and items[0]["pid"] != harness.pid
    assert [c.params["durationSeconds"] for c in api.of("/schedule")] == ["10"]  # asked for this call: 2 × 5


def test_the_duration_is_asked_per_call(harness, api):
    for seconds in (7, 31, 90):
        assert harness.call("asks", seconds)["value"] == seconds
    assert [int(c.params["durationSeconds"]) for c in api.of("/schedule")] == [7, 31, 90]


def test_stop_closes_the_generator_in_the_worker_and_releases_the_gpu(harness, api, tmp_path):
    """Gradio closes a cancelled event's generator; the package tells the worker, which closes the job's."""
    marker = tmp_path / "closed-at"
    items = harness.call("slow_count", 50, str(marker), take=2)["value"]
    assert items == [0, 1]
    deadline = time.monotonic() + 30
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marker.exists() and int(marker.read_text()) < 10  # ended long before its 50 items
    assert api.paths()[-1] == "/release"


def test_a_thread_of_the_main_process_does_not_exist_in_the_worker(harness, api):
    """What a stepping engine thread started in the main process meets on ZeroGPU."""
    assert harness.call("thread_job_here")["value"] == "served"
    assert harness.call("thread_job")["value"] == "never served"


def _refusal(harness, seconds: int) -> str:
    out = harness.call("asks", seconds)
    assert out["error"] == "UserError", out  # kvviz explained it (None from quota_message would pass it through)
    assert len(out["message"]) > 0
    return out["message"]


def test_every_refusal_the_package_gives_is_explained(harness, api):
    api.left_s = 20
    limit = _refusal(harness, 45)  # no X-IP-Token: the Space's own allowance
    assert "45 s" in limit and "GPU limit" in limit and "visitor token" in limit
    api.left_s, api.max_duration_s = 10_000, 120
    illegal = _refusal(harness, 300)
    assert "300 s" in illegal and "more than one GPU call may last" in illegal
    api.available = False
    busy = _refusal(harness, 10)
    assert "No GPU was available" in busy and "no GPU free" in busy
    assert not api.of("/allow")  # nothing ran: each was refused at /schedule


def test_quota_message_explains_each_refusal_text_of_the_package():
    """The titles and texts of spaces 0.51.3's refusals (client.py), as ``gr.Error`` carries them."""
    import gradio as gr

    cases = {
        (
            "ZeroGPU quota exceeded",
            "You have exceeded your free ZeroGPU quota (90s requested vs. 41s left). Try again in 0:07:12. ",
        ): "quota for today",
        ("ZeroGPU quota exceeded", "You have exceeded your ZeroGPU runs limit. "): "quota for today",
        (
            "ZeroGPU quota exceeded",
            "Space app has reached its GPU limit. Try re-running outside of examples",
        ): "visitor token",
        (
            "ZeroGPU illegal duration",
            "The requested GPU duration (300s) is larger than the maximum allowed",
        ): "more than one GPU call",
        ("ZeroGPU client error", "No GPU was available"): "no GPU free",
        ("ZeroGPU quota exceeded", "No GPU was available after 60s. Try re-running outside of examples"): "no GPU free",
        (
            "ZeroGPU pending credits exceeded",
            "You have too many ZeroGPU credits allocated to running tasks.",
        ): "credits",
        ("ZeroGPU worker error", "GPU task aborted"): "ended this job",
    }
    for (title, text), expected in cases.items():
        message = quota_message(gr.Error(text, title=title), 90)
        assert message is not None and expected in message, (title, text, message)
    assert quota_message(gr.Error("Top-p must lie in (0, 1]"), 90) is None
