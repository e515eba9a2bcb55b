"""A process that calls functions wrapped by kvviz's ``gpu`` under the real ``spaces`` package (test-only).

Started by ``tests/zerogpu/conftest.py`` with the CPU shim (``tests/zerogpu/cpu``) on ``PYTHONPATH`` and the fake
device API's URL in ``SPACES_ZERO_DEVICE_API_URL``; it reads one JSON command per line on stdin,
``{"fn": name, "args": [...], "take": k}`` (``take``: a generator is closed after k items, as Gradio closes a
cancelled event), and answers one line ``@@{"value": …}`` or ``@@{"error": class, "message": …, "title": …}``
(``spaces`` prints tracebacks on stdout, so answers are marked).
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
import time

from kvviz.ui.serving.gpu import gpu

MAIN_PID = os.getpid()
STATE = {"n": 0}
JOBS: queue.Queue = queue.Queue()


def _serve() -> None:
    while True:
        JOBS.get().put("served")


threading.Thread(target=_serve, daemon=True).start()


def state() -> dict:
    """Module state in the process that holds the GPU: a reused worker keeps it, a fresh one starts again."""
    STATE["n"] += 1
    return {"n": STATE["n"], "pid": os.getpid(), "main": MAIN_PID}


def fail(message: str) -> None:
    raise RuntimeError(message)


def fail_value(message: str) -> None:
    raise ValueError(message)


def count_to(n: int):
    for i in range(n):
        yield {"i": i, "pid": os.getpid()}


def slow_count(n: int, marker: str):
    """Yields slowly; writes to ``marker`` how far it got when it ends (closed by a Stop, or done)."""
    i = 0
    try:
        for i in range(n):
            yield i
            time.sleep(0.2)
    finally:
        with open(marker, "w") as f:
            f.write(str(i))


def thread_job() -> str:
    """A job handed to a thread of the main process: that thread does not exist in a forked worker."""
    reply: queue.Queue = queue.Queue()
    JOBS.put(reply)
    try:
        return reply.get(timeout=1.0)
    except queue.Empty:
        return "never served"


def asks(seconds: int) -> int:
    return seconds


FUNCTIONS = {
    "state": gpu(state, duration=5),
    "fail": gpu(fail, duration=5),
    "fail_value": gpu(fail_value, duration=5),
    "count_to": gpu(count_to, duration=lambda n: 2 * n),
    "slow_count": gpu(slow_count, duration=10),
    "thread_job": gpu(thread_job, duration=5),
    "thread_job_here": thread_job,
    "asks": gpu(asks, duration=lambda seconds: seconds),
}


def call(command: dict) -> dict:
    fn = FUNCTIONS[command["fn"]]
    try:
        out = fn(*command.get("args", []))
        if hasattr(out, "__next__"):
            items = []
            take = command.get("take")
            for item in out:
                items.append(item)
                if take is not None and len(items) >= take:
                    out.close()
                    break
            out = items
        return {"value": out}
    except Exception as exc:  # noqa: BLE001 - every outcome goes back to the test
        return {"error": type(exc).__name__, "message": str(exc), "title": getattr(exc, "title", None)}


def main() -> None:
    print("@@" + json.dumps({"ready": MAIN_PID}), flush=True)
    for line in sys.stdin:
        if line.strip():
            print("@@" + json.dumps(call(json.loads(line)), default=str), flush=True)


if __name__ == "__main__":
    main()
