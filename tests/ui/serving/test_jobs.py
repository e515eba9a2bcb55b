"""jobs.client_of: the address a request's admission is counted under, directly or behind a Space's proxy."""

from __future__ import annotations

from types import SimpleNamespace

from kvviz.ui.serving.jobs import client_of


def _request(peer: str, forwarded: str | None = None):
    headers = {} if forwarded is None else {"x-forwarded-for": forwarded}
    return SimpleNamespace(client=SimpleNamespace(host=peer), headers=headers)


def test_without_a_proxy_the_peer_is_the_caller_whatever_it_forwards():
    assert client_of(_request("203.0.113.7", "10.9.9.9")) == "203.0.113.7"
    assert client_of(None) is None


def test_behind_a_proxy_the_address_it_appended_counts_not_the_forged_ones():
    forged = _request("10.0.0.2", "1.1.1.1, 2.2.2.2, 198.51.100.4")  # the caller wrote the first two
    assert client_of(forged, proxy_hops=1) == "198.51.100.4"
    assert client_of(forged, proxy_hops=2) == "2.2.2.2"
    assert client_of(_request("10.0.0.2"), proxy_hops=1) == "10.0.0.2"  # no header: the peer
