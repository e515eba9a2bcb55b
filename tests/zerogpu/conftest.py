"""Fixtures for the ZeroGPU tests: the fake device API (in this process) and processes running the real ``spaces``.

Nothing here imports ``spaces`` into the pytest process: with ``SPACES_ZERO_GPU`` set it patches torch for the
whole process (``torch.cuda.is_available()`` becomes True). Processes that run it are started with
:func:`zero_env` (the CPU shim in ``tests/zerogpu/cpu`` first on ``PYTHONPATH``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.zerogpu.device_api import DeviceAPI

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
ANSWER_S = 120.0  # far above any harness call on two busy cores (a fork and a few pickles)


def zero_env(api: DeviceAPI, **extra: str) -> dict[str, str]:
    """The environment of a ZeroGPU Space's main process, pointed at ``api``, with the CPU shim."""
    return {
        "PYTHONPATH": f"{HERE / 'cpu'}:{ROOT}",
        "SPACES_ZERO_GPU": "true",
        "SPACES_ZERO_DEVICE_API_URL": api.url,
        "KVVIZ_DEVICE": "cpu",
        **extra,
    }


@pytest.fixture(scope="package")
def device_api():
    api = DeviceAPI().start()
    yield api
    api.stop()


@pytest.fixture
def api(device_api):
    """The package's fake device API, its knobs reset and its record cleared for this test."""
    device_api.reset()
    yield device_api
    device_api.reset()


class Harness:
    """``tests/zerogpu/harness.py`` in its own process: :meth:`call` runs one of its functions there."""

    def __init__(self, api: DeviceAPI, tmp: Path):
        import os

        env = {**os.environ, **zero_env(api), "ZEROGPU_PROC_SELF_CGROUP_PATH": "/proc/self/cgroup"}
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "harness.py")],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=(tmp / "harness.err").open("w"),
            text=True,
        )
        self.pid = self._answer()["ready"]

    def _answer(self) -> dict:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("@@"):
                return json.loads(line[2:])
        raise RuntimeError(f"the harness exited with {self.proc.wait()}")

    def call(self, fn: str, *args, take: int | None = None) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"fn": fn, "args": list(args), "take": take}) + "\n")
        self.proc.stdin.flush()
        return self._answer()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)


@pytest.fixture(scope="package")
def harness(device_api, tmp_path_factory):
    h = Harness(device_api, tmp_path_factory.mktemp("harness"))
    yield h
    h.close()
