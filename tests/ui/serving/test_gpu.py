"""kvviz.ui.serving.gpu: handlers are unchanged without ZeroGPU's ``spaces`` package and wrapped by ``spaces.GPU`` with it."""

from __future__ import annotations

import inspect
import sys

import pytest

from kvviz.ui.serving import gpu as gpu_module

FAKE_SPACES = """
calls = []

def GPU(duration=60):
    def wrap(fn):
        import functools
        if __import__("inspect").isgeneratorfunction(fn):
            @functools.wraps(fn)
            def gen(*a, **k):
                calls.append((fn.__name__, duration))
                yield from fn(*a, **k)
            return gen
        @functools.wraps(fn)
        def call(*a, **k):
            calls.append((fn.__name__, duration))
            return fn(*a, **k)
        return call
    return wrap
"""


def handler(prompt: str, n: int = 3) -> str:
    return prompt * n


def streamer(prompt: str):
    yield from prompt


def test_off_zerogpu_the_handler_is_returned_unchanged(monkeypatch):
    """``spaces`` is installed for the tests (tests/zerogpu), but only a ZeroGPU Space sets SPACES_ZERO_GPU."""
    monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)
    assert not gpu_module.spaces_available()  # the CPU path is the tested default
    assert gpu_module.gpu(handler) is handler
    assert gpu_module.gpu(streamer) is streamer


@pytest.fixture
def fake_spaces(tmp_path, monkeypatch):
    """A stand-in for the ``spaces`` package that records each decorated call."""
    (tmp_path / "spaces.py").write_text(FAKE_SPACES)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "spaces", raising=False)
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    yield
    sys.modules.pop("spaces", None)


def test_with_spaces_gpu_work_runs_inside_its_decorator(fake_spaces):
    import spaces

    assert gpu_module.spaces_available()
    wrapped = gpu_module.gpu(handler)
    assert wrapped is not handler
    assert inspect.signature(wrapped) == inspect.signature(handler)  # Gradio reads the inputs from it
    assert wrapped("ab", 2) == "abab"
    assert list(gpu_module.gpu(streamer, duration=30)("xy")) == ["x", "y"]
    assert spaces.calls == [("handler", gpu_module.GPU_SECONDS), ("streamer", 30)]
