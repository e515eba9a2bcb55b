"""Time from ``python app.py`` to the first HTTP 200, twice (the second start uses the converted model).

Run: ``.venv/bin/python bench/cold_start.py [--runs 2]``. Target: the second start answers within 20 s.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def time_start(timeout: float = 300.0) -> float:
    port = free_port()
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "app.py", "--port", str(port)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        while time.perf_counter() - t0 < timeout:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as r:
                    if r.status == 200:
                        return time.perf_counter() - t0
            except OSError:
                time.sleep(0.2)
            if proc.poll() is not None:
                raise RuntimeError(f"app.py exited with {proc.returncode}")
        raise TimeoutError("no HTTP 200 in time")
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--runs", type=int, default=2)
    args = p.parse_args()
    times = [time_start() for _ in range(args.runs)]
    for i, t in enumerate(times, 1):
        print(f"start {i}: HTTP 200 after {t:.1f} s")
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "cold_start.json").write_text(json.dumps({"seconds": times}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
