"""Test-only CPU shim: lets the real ``spaces`` package (Hugging Face ZeroGPU) run its own code on a CPU-only torch.

A process started with this folder first on ``PYTHONPATH`` and ``SPACES_ZERO_GPU=true`` imports it at start-up
(Python's ``sitecustomize`` hook), before anything else. It meets the package's needs that a CPU build of torch
cannot, and nothing more; everything else — scheduling with the device API, forking and reusing the worker,
pickling arguments and results, refusals, releasing — is the package's own code:

1. ``spaces/zero/torch/static.py`` reads ``torch.version.cuda.startswith(…)`` (None on a CPU build): set to "12.8";
2. ``spaces/zero/torch/patching.py`` keeps ``torch._C._cuda_init`` at import (absent on a CPU build): a stand-in
   that raises as a CPU build's CUDA calls do;
3. ``spaces.zero.torch.is_in_bad_fork`` pickles ``torch.cuda._is_in_bad_fork`` into a fork pool (a lambda on a CPU
   build, which cannot be pickled): a module-level function that answers False;
4. the worker's ``init()`` (``torch.Tensor([0]).cuda()``) and ``move()`` (``.cuda()`` on every tensor the main
   process placed on the emulated GPU, then ``torch.cuda.synchronize()``) are made no-ops once
   ``spaces.zero.torch`` is imported (an import hook: the app imports ``spaces`` when it wants, as on a Space).

What this cannot give: a model placed on CUDA in the main process (``torch.cuda.is_available()`` is True there
once ``spaces`` patched torch) has nowhere real to go in the worker, so served apps under this shim are started
with ``KVVIZ_DEVICE=cpu``.

With ``FAKE_ZEROGPU_LOG`` set, every ``torch.nn.Module`` forward that runs outside a GPU call's worker is written
there as ``{"outside": <module>}`` (once per process): ZeroGPU's main process has no GPU to run it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys

ACTIVE = os.environ.get("SPACES_ZERO_GPU", "").lower() in ("1", "t", "true")
_REPORTED = False


def _never_in_bad_fork() -> bool:
    return False


def _cuda_init() -> None:
    raise RuntimeError("Torch not compiled with CUDA enabled (CPU shim for the spaces package)")


def _init(nvidia_uuid: str) -> None:
    """The worker's CUDA initialisation: nothing to initialise on a CPU."""


def _move(callback=None) -> None:
    """The worker's copy of emulated-CUDA tensors to the GPU: nothing was placed there (KVVIZ_DEVICE=cpu)."""


class _AfterSpacesTorch(importlib.abc.MetaPathFinder):
    """Replaces ``init`` and ``move`` in ``spaces.zero.torch`` right after that module runs."""

    def find_spec(self, name, path, target=None):
        if name != "spaces.zero.torch":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module) -> None:
            run(module)
            module.init, module.move = _init, _move

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _forward_outside(module, _inputs) -> None:
    global _REPORTED
    wrappers = sys.modules.get("spaces.zero.wrappers")
    if _REPORTED or (wrappers is not None and wrappers.forked):
        return
    _REPORTED = True
    with open(os.environ["FAKE_ZEROGPU_LOG"], "a") as f:
        f.write(json.dumps({"outside": type(module).__name__, "pid": os.getpid()}) + "\n")


if ACTIVE:
    import torch

    if torch.version.cuda is None:
        torch.version.cuda = "12.8"  # type: ignore[misc]
    if not hasattr(torch._C, "_cuda_init"):
        torch._C._cuda_init = _cuda_init
    torch.cuda._is_in_bad_fork = _never_in_bad_fork
    sys.meta_path.insert(0, _AfterSpacesTorch())
    if os.environ.get("FAKE_ZEROGPU_LOG"):
        torch.nn.modules.module.register_module_forward_pre_hook(_forward_outside)
