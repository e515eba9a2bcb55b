"""``gpu(fn)``: run a handler inside Hugging Face ZeroGPU's ``spaces.GPU`` when that package is installed.

On ZeroGPU a GPU is attached only while a ``spaces.GPU``-decorated function runs; everywhere else
(``spaces`` not importable: a laptop, CI, a plain CPU or CUDA server) ``gpu`` returns ``fn``
unchanged, so the CPU path stays the tested default. Wrap every handler that runs the model.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable)
GPU_SECONDS = 120  # longest single job ZeroGPU should allow (a max-length generation with verification)


def spaces_available() -> bool:
    """True where the ``spaces`` package (ZeroGPU) can be imported."""
    return importlib.util.find_spec("spaces") is not None


def gpu(fn: F, duration: int = GPU_SECONDS) -> F:
    """``spaces.GPU(duration=…)(fn)`` on ZeroGPU, else ``fn`` itself (generators stay generators)."""
    if not spaces_available():
        return fn
    import spaces

    return spaces.GPU(duration=duration)(fn)
