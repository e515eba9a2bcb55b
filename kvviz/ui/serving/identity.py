"""Who is calling: one session key per caller, and the network address its jobs count against.

Everything per session on the serving path — the one-job slot at the gates, the owner of prefix blocks (what
the Blocks view shows a session), the cache salt, the Stop flag, the exported files — is keyed by
:func:`session_of`, and nothing else derives a session. The rule, one key per kind of caller:

- a Gradio session (a browser tab, or the ``session_hash`` an API client sends) is ``s:<hash>``;
- an MCP tool call is its MCP caller: Gradio's MCP bridge sends every queued tool call through one client with
  one session hash, so :class:`McpCallers` stamps each MCP request with a signed note of who sent it (its
  ``mcp-session-id`` header and its network address); the bridge passes the request's headers on to the
  handler, where a valid note gives ``mcp:<digest>`` and the address the per-address bound counts;
- a request without a session (``/gradio_api/run/...`` carries none) is a session of its own, ``anon:<random>``,
  remembered on that request only;
- a call with no request at all (tests, the server's own work) is :data:`IN_PROCESS`.

The prefixes keep the kinds apart and the other parts cannot be guessed (a random hash, a digest under this
process's secret), so no request borrows another's identity by naming it.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import ipaddress
import secrets

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from kvviz.admission import NO_SESSION

IN_PROCESS = NO_SESSION  # a call with no request: the library's own key for it
ANONYMOUS = "anon:"  # the prefix of a no-session request's key: nobody else can ever name it
CALLER_HEADER = "x-kvviz-mcp-caller"  # the signed note McpCallers adds to an MCP request
MCP_PATH = "/gradio_api/mcp"
_SECRET = secrets.token_bytes(32)  # signs the notes; a new one each start (a note lives one request)
_REMEMBERED = "_kvviz_session"  # where a request keeps the key it was given


def session_of(request) -> str:
    """The caller's session key (see the module's rule); the same for every call with one request."""
    if request is None:
        return IN_PROCESS
    known = vars(request).get(_REMEMBERED) if hasattr(request, "__dict__") else None
    if known:
        return known
    caller = mcp_caller(request)
    if caller is not None:
        key = "mcp:" + caller[1]
    elif getattr(request, "session_hash", None):
        key = "s:" + str(request.session_hash)
    else:
        key = ANONYMOUS + secrets.token_hex(16)
    with contextlib.suppress(AttributeError):  # an object without attributes: a no-session caller gets one per call
        setattr(request, _REMEMBERED, key)
    return key


def client_of(request, proxy_hops: int = 0) -> str | None:
    """The caller's network address, an IPv6 caller's as its /64 (:func:`network_of`).

    Gradio gives the connection's peer (``request.client.host``; uvicorn already puts there the X-Forwarded-For
    address a proxy on the loopback sends). Behind ``proxy_hops`` proxies that each append the address they saw
    to X-Forwarded-For (a Space's), it is the entry that many from the end: the ones before it are the caller's
    own to forge. An MCP tool call reaches the handler from Gradio's own client on the loopback; its address is
    the one :class:`McpCallers` signed."""
    if request is None:
        return None
    caller = mcp_caller(request)
    if caller is not None:
        return caller[0] or None
    return network_of(_peer(request, proxy_hops))


def _peer(request, proxy_hops: int) -> str | None:
    if proxy_hops > 0:
        headers = getattr(request, "headers", None) or {}
        forwarded = [a.strip() for a in (headers.get("x-forwarded-for") or "").split(",") if a.strip()]
        if len(forwarded) >= proxy_hops:
            return forwarded[-proxy_hops]
    client = getattr(request, "client", None)
    return getattr(client, "host", None) or None


def network_of(address: str | None) -> str | None:
    """The address one caller is counted by: an IPv4 address as it is, an IPv6 one as its /64 network (one
    subscriber's, which holds 2⁶⁴ addresses to rotate through), an IPv4-mapped IPv6 address as its IPv4 one;
    anything else (a host name) as given."""
    if not address:
        return address
    try:
        ip = ipaddress.ip_address(address.strip().strip("[]").split("%", 1)[0])
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


# ---- MCP callers --------------------------------------------------------------------------------------
def _mac(payload: bytes) -> str:
    return hmac.new(_SECRET, payload, hashlib.sha256).hexdigest()


def sign_caller(address: str | None, mcp_session: str | None) -> str:
    """The note :class:`McpCallers` puts on an MCP request: who sent it, signed with this process's secret."""
    payload = f"{address or ''}\n{(mcp_session or '')[:128]}".encode()
    return base64.urlsafe_b64encode(payload).decode() + "." + _mac(payload)


def mcp_caller(request) -> tuple[str, str] | None:
    """(address, digest) of the MCP caller a request carries a valid note of; None for any other request (a
    forged or altered note included)."""
    headers = getattr(request, "headers", None)
    note = headers.get(CALLER_HEADER) if headers is not None else None
    if not note or "." not in note or len(note) > 1024:
        return None
    encoded, mac = note.rsplit(".", 1)
    try:
        payload = base64.urlsafe_b64decode(encoded.encode())
    except ValueError:
        return None
    if not hmac.compare_digest(mac, _mac(payload)):
        return None
    address = payload.decode(errors="replace").split("\n", 1)[0]
    return address, mac[:32]


class McpCallers:
    """ASGI middleware: every request to the MCP server carries a signed note of its caller (``CALLER_HEADER``,
    replacing any the caller sent), which Gradio's MCP bridge passes on with the request's headers to the
    handler the tool runs (:func:`session_of`, :func:`client_of`)."""

    def __init__(self, app: ASGIApp, proxy_hops: int = 0):
        self.app, self.proxy_hops = app, proxy_hops

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and MCP_PATH in scope.get("path", ""):
            request = Request(scope)
            address = network_of(_peer(request, self.proxy_hops))
            note = sign_caller(address, request.headers.get("mcp-session-id"))
            name = CALLER_HEADER.encode()
            headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() != name]
            scope = {**scope, "headers": [*headers, (name, note.encode())]}
        await self.app(scope, receive, send)
