"""Gradio's status timers tick ten times a second on a plain timer, not on every frame the screen could draw.

Each of Gradio's status trackers counts the seconds of a pending event in a ``requestAnimationFrame`` loop, and a
tracker that leaves the page while pending (the start-up loading status does, on every page) never stops its
loop: the open page asks the browser for a frame sixty times a second for as long as it stays open, and each
frame takes a turn of the page's, the compositor's and the display's threads on the machine's cores. A page
open beside the model on a lecturer's two-core laptop takes those turns from the model, whose threads wait for
each other. :data:`STATUS_TIMER_JS` wraps the browser's ``requestAnimationFrame``: a frame asked for by the
status tracker's own file runs on a timer every :data:`TICK_MS` ms instead (the timer shows tenths of a
second, so nothing on screen changes), and a timer with nothing to show then costs a call, not a frame. Every
other caller (plotly, Svelte's transitions) keeps the browser's frames. A Gradio whose tracker lives in a file
of another name simply keeps its frames.

The tracker reads ``requestAnimationFrame`` once, when its file loads, before Gradio adds a Blocks' ``head`` to
the page; so :class:`FirstScript` puts the script in the page's HTML as it is sent, the first thing its
``<head>`` runs.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

TICK_MS = 100  # the status timer's own resolution: it shows tenths of a second

STATUS_TIMER_JS = """
(() => {
  if (window.kvvizStatusTimer) return;
  window.kvvizStatusTimer = true;
  const frame = window.requestAnimationFrame.bind(window), cancel = window.cancelAnimationFrame.bind(window);
  const tracker = /\\/statustracker-[^/]*\\.js/;
  window.requestAnimationFrame = (callback) => {
    // the caller's line: [2] in Chromium's stack ([0] the message, [1] this function), [1] in Firefox's and Safari's
    const callers = (new Error().stack || '').split('\\n').slice(1, 3);
    if (!callers.some((line) => tracker.test(line))) return frame(callback);
    return -setTimeout(() => callback(performance.now()), __TICK__);  // negative: a timer's id, not a frame's
  };
  window.cancelAnimationFrame = (id) => (id < 0 ? clearTimeout(-id) : cancel(id));
})();
""".replace("__TICK__", str(TICK_MS))
PAGE_PATH = "/"  # Gradio's page (kvviz has one); every other route's answer passes untouched


class FirstScript:
    """ASGI middleware: the page's HTML (``GET /``) carries ``script`` as the first child of its ``<head>``, so it
    runs before any of Gradio's own scripts (``HEAD /`` says the same length). Any other answer, or a page without
    a ``<head>``, passes as it is."""

    def __init__(self, app: ASGIApp, script: str = STATUS_TIMER_JS):
        self.app, self.tag = app, f"<script>{script}</script>".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") not in ("GET", "HEAD") or scope.get("path") != PAGE_PATH:
            await self.app(scope, receive, send)
            return
        if scope["method"] == "HEAD":
            await self.app(scope, receive, self._longer(send))
            return
        start: Message | None = None
        body: list[bytes] = []

        async def edit(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start" and _plain_html(message):
                start = message  # held until the whole body is here: its length changes
                return
            if start is None or message["type"] != "http.response.body":
                await send(message)
                return
            body.append(message.get("body", b""))
            if message.get("more_body"):
                return
            page = b"".join(body).replace(b"<head>", b"<head>" + self.tag, 1)
            headers = [(k, v) for k, v in start["headers"] if k.lower() != b"content-length"]
            await send({**start, "headers": [*headers, (b"content-length", str(len(page)).encode())]})
            await send({"type": "http.response.body", "body": page})

        await self.app(scope, receive, edit)

    def _longer(self, send: Send) -> Send:
        """``send`` with the page's length grown by the script's: a HEAD answer has the headers a GET's has."""

        async def longer(message: Message) -> None:
            if message["type"] == "http.response.start" and _plain_html(message):
                headers = [
                    (k, str(int(v) + len(self.tag)).encode() if k.lower() == b"content-length" else v)
                    for k, v in message["headers"]
                ]
                message = {**message, "headers": headers}
            await send(message)

        return longer


def _plain_html(start: Message) -> bool:
    """An HTML answer sent as it is (not compressed), so its text can be edited."""
    headers = {k.lower(): v for k, v in start.get("headers", [])}
    return headers.get(b"content-type", b"").startswith(b"text/html") and b"content-encoding" not in headers
