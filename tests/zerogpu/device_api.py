"""A fake ZeroGPU device API on 127.0.0.1, for the real ``spaces`` package (test-only).

On a ZeroGPU Space, ``spaces`` (``spaces/zero/api.py``, ``client.py``) talks to a device API at
``SPACES_ZERO_DEVICE_API_URL``: ``POST /startup-report`` once at launch, ``POST /schedule`` before each
``@spaces.GPU`` call (200 with ``{idle, nvidiaIndex, nvidiaUUID, allowToken}`` — ``idle: true`` lets the
package reuse the worker process of an earlier call; 429 with ``{left, wait}`` for a quota refusal, a
negative ``wait`` for a duration above the maximum; 503 when no GPU is free), ``POST /allow`` from the
forked worker, ``POST /release`` when the call ends. This server answers those the way the package
expects, with knobs a test sets (:class:`DeviceAPI`'s fields), and records every call.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse


@dataclass
class Call:
    """One request the package sent: its path, query parameters and when it arrived (``time.monotonic``)."""

    path: str
    params: dict[str, str]
    at: float


@dataclass
class DeviceAPI:
    """The knobs: ``idle`` (reuse workers), ``left_s`` (quota seconds left), ``max_duration_s`` (the largest
    duration a call may ask for), ``available`` (False: 503), ``authenticated`` (the X-Authenticated header)."""

    idle: bool = True
    left_s: int = 10_000
    max_duration_s: int = 600
    available: bool = True
    authenticated: str | None = None
    wait_s: int = 30
    calls: list[Call] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def paths(self, since: int = 0) -> list[str]:
        with self._lock:
            return [c.path for c in self.calls[since:]]

    def of(self, path: str, since: int = 0) -> list[Call]:
        with self._lock:
            return [c for c in self.calls[since:] if c.path == path]

    def reset(self) -> None:
        with self._lock:
            self.calls.clear()
        self.idle, self.left_s, self.max_duration_s, self.available = True, 10_000, 600, True
        self.authenticated = None

    # ---- serving ------------------------------------------------------------------------------------
    def answer(self, path: str, params: dict[str, str]) -> tuple[int, dict | None, dict[str, str]]:
        with self._lock:
            self.calls.append(Call(path, params, time.monotonic()))
        headers = {"X-Authenticated": self.authenticated} if self.authenticated else {}
        if path != "/schedule":
            return 200, {}, headers
        if not self.available:
            return 503, None, headers
        asked = int(params.get("durationSeconds", 60))
        if asked > self.max_duration_s:
            return 429, {"left": self.left_s, "wait": -1}, headers
        if asked > self.left_s:
            return 429, {"left": self.left_s, "wait": self.wait_s}, headers
        body = {"idle": self.idle, "nvidiaIndex": 0, "nvidiaUUID": "GPU-fake", "allowToken": uuid.uuid4().hex}
        return 200, body, headers

    def start(self) -> DeviceAPI:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                url = urlparse(self.path)
                params = {k: v[-1] for k, v in parse_qs(url.query).items()}
                status, body, headers = api.answer(url.path, params)
                data = json.dumps(body).encode() if body is not None else b""
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
