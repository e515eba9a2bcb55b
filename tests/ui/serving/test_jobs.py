"""identity.client_of: the address a request's admission is counted under, directly or behind a Space's proxy;
Jobs.turns: the line a waiting ticket reports is the one it waits in."""

from __future__ import annotations

from types import SimpleNamespace

from kvviz.settings import Settings
from kvviz.ui.serving.identity import client_of
from kvviz.ui.serving.jobs import Jobs


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


def test_a_waiting_generate_run_is_told_its_place_in_the_room_s_line_not_the_other_gate_s():
    settings = Settings(concurrency=1, room_size=1, queue_size=8)
    jobs = Jobs(settings, SimpleNamespace(layers=2, kv_bytes_per_token=64))

    def caller(name: str):
        return SimpleNamespace(session_hash=name, client=SimpleNamespace(host="198.51.100.1"), headers={})

    running = jobs.admit(caller("a"), "generation", 8, 4, room=True)
    waiting = jobs.admit(caller("b"), "generation", 8, 4, room=True)
    other = jobs.admit(caller("c"), "eviction run", 8, 4)  # the one-at-a-time gate: running, nobody waits there
    try:
        line = next(jobs.turns(waiting, poll=0.01))
        assert line.startswith("Queued: position 1 of 1 "), line
    finally:
        for ticket in (running, waiting, other):
            ticket.release()
