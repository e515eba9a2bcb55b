"""identity: one session key rule for every caller, no key another request can name, an IPv6 caller counted by
its /64, and the signed note that makes each MCP caller a session of its own."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import anyio
import pytest

from kvviz.ui.serving import identity
from kvviz.ui.serving.identity import CALLER_HEADER, IN_PROCESS, McpCallers, client_of, network_of, session_of


def _request(session: str | None = None, peer: str = "198.51.100.7", **headers):
    return SimpleNamespace(session_hash=session, client=SimpleNamespace(host=peer), headers=headers)


def test_a_request_without_a_session_is_a_session_of_its_own():
    one, two = _request(), _request()
    assert session_of(one) != session_of(two)
    assert session_of(one) == session_of(one)  # every step of one request agrees
    assert session_of(None) == IN_PROCESS


@pytest.mark.parametrize("named", ["anonymous", "default", IN_PROCESS, "anon:", "mcp:x", "s:abc"])
def test_no_session_hash_a_client_sends_names_another_kind_of_caller(named):
    assert session_of(_request(named)) == "s:" + named
    assert session_of(_request(named)) not in {session_of(_request()), IN_PROCESS}


@pytest.mark.parametrize(
    "address, counted",
    [
        ("203.0.113.9", "203.0.113.9"),
        ("2001:db8:1:2:aaaa:bbbb:cccc:dddd", "2001:db8:1:2::/64"),
        ("2001:db8:1:2::1", "2001:db8:1:2::/64"),
        ("[2001:db8:1:3::1]", "2001:db8:1:3::/64"),
        ("fe80::1%eth0", "fe80::/64"),
        ("::ffff:203.0.113.9", "203.0.113.9"),
        ("testclient", "testclient"),
        (None, None),
    ],
)
def test_an_ipv6_caller_is_counted_by_its_64(address, counted):
    assert network_of(address) == counted


def test_one_ipv6_64_is_one_caller_at_the_gate():
    callers = {client_of(_request(peer=f"2001:db8:0:7::{i:x}")) for i in range(1, 121)}
    assert callers == {"2001:db8:0:7::/64"}
    forwarded = _request(peer="10.0.0.2", **{"x-forwarded-for": "2001:db8:0:8::beef"})
    assert client_of(forwarded, proxy_hops=1) == "2001:db8:0:8::/64"


def _through_middleware(headers: list[tuple[bytes, bytes]], peer: str, path: str = "/gradio_api/mcp/") -> dict:
    """The headers the MCP server receives once McpCallers has seen the request."""
    seen: dict = {}

    async def app(scope, receive, send):
        seen.update({k.decode(): v.decode() for k, v in scope["headers"]})

    scope = {"type": "http", "path": path, "headers": headers, "client": (peer, 5000), "query_string": b""}
    # a thread of its own: the browser tests' Playwright may leave an event loop running in this one
    with ThreadPoolExecutor(1) as pool:
        pool.submit(anyio.run, McpCallers(app), scope, None, None).result()
    return seen


def test_each_mcp_caller_gets_a_signed_note_and_a_session_of_its_own():
    a = _through_middleware([(b"mcp-session-id", b"one")], "198.51.100.1")
    b = _through_middleware([(b"mcp-session-id", b"two")], "198.51.100.1")
    c = _through_middleware([], "198.51.100.2")
    # Gradio's MCP bridge calls every handler with its one client's session hash and the caller's headers
    keys = [session_of(_request("the-bridge", "127.0.0.1", **h)) for h in (a, b, c)]
    assert len(set(keys)) == 3 and all(k.startswith("mcp:") for k in keys)
    assert session_of(_request("the-bridge", "127.0.0.1", **a)) == keys[0]  # the same caller again: the same
    assert client_of(_request("the-bridge", "127.0.0.1", **c)) == "198.51.100.2"  # its address, not the bridge's


def test_a_note_cannot_be_forged_or_carried_to_another_route():
    forged = identity.sign_caller("198.51.100.1", "one").rsplit(".", 1)[0] + "." + "0" * 64
    assert session_of(_request("s1", **{CALLER_HEADER: forged})) == "s:s1"
    assert client_of(_request("s1", "203.0.113.5", **{CALLER_HEADER: forged})) == "203.0.113.5"
    sent = _through_middleware([(CALLER_HEADER.encode(), forged.encode())], "198.51.100.3")
    assert sent[CALLER_HEADER] != forged  # the caller's own note is replaced
    untouched = _through_middleware([(CALLER_HEADER.encode(), b"x")], "198.51.100.3", path="/gradio_api/call/x")
    assert untouched[CALLER_HEADER] == "x"  # other routes pass as sent (and an unsigned note counts for nothing)
