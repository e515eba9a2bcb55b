"""A chat turn in the prefix store: its prompt and answer kept, so the next turn starts from them.

A plain run stores only its prompt's leading blocks (:meth:`~kvviz.engine.prefix.PrefixStore.store`). A chat
turn's next prompt repeats the whole turn — the prompt and the answer, as the template renders them — so the
finished turn's cache is worth keeping too: before its first forward :func:`keep_turn` asks the recorder to
keep the rows of the blocks past the prompt's stored ones, and once it ends, its cache still whole,
:func:`store_turn` stores them, chained after the prompt's blocks and under the same (session-salted) hashes
the next turn's claim will look for. :func:`held_tokens` says, without side effects, how much of a token
sequence the store holds now.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvviz.capture.generation import Generation
from kvviz.engine.prefix import SERVER, Block, Claim, PrefixStore, layer_kv


def keep_turn(store: PrefixStore, g: Generation, claim: Claim) -> None:
    """Before the turn's first forward (after the claim): the recorder keeps the rows of the blocks past the
    prompt's stored ones, up to the store's reach."""
    b = store.block_size
    start = len(claim.hashes) * b
    end = min(g.trace.n_prompt + g.max_new_tokens - 1, store.max_tokens) // b * b
    if g.rec is None or not g.default_cache or store.cache.capacity_bytes <= 0 or end <= start:
        return
    g.rec.keep_turn_rows(start, end)


def store_turn(store: PrefixStore, g: Generation, claim: Claim, owners: Iterable[str | None] = (SERVER,)) -> int:
    """After the turn's last step: insert the full blocks its cache holds past the prompt's — the rest of the
    prompt and the answer, up to the store's reach — pinned for the run like them. The tokens the store then
    holds for this turn."""
    b, owners = store.block_size, list(owners)
    rec = g.rec
    if rec is None or rec.turn_rows is None or len(claim.held) < len(claim.hashes):  # a block found no room
        return len(claim.held) * b
    rows, s = rec.turn_rows, rec.turn_start
    rec.turn_rows = None
    ids = g.trace.token_ids[: min(g.fed, s + rows.shape[2]) // b * b]  # the cache holds g.fed tokens
    hashes = store.hasher_for(owners[0] if owners else SERVER)(ids)
    for j in range(len(claim.hashes), len(hashes)):
        start, end = j * b, (j + 1) * b
        kv = [(k[:, :, start:end].clone(), v[:, :, start:end].clone()) for k, v in layer_kv(g.cache)]
        parent = hashes[j - 1] if j else None
        payload = Block(kv, rows[:, :, start - s : end - s, :end].clone(), tuple(ids[start:end]), parent, start)
        if not store.insert(hashes[j], payload, owners, claim):
            break
    store.flush()
    return len(claim.held) * b


def held_tokens(store: PrefixStore, token_ids: list[int], owner: str | None = SERVER) -> int:
    """How many leading tokens of ``token_ids`` the store holds now for ``owner``, in whole blocks."""
    hashes = store.hasher_for(owner)(token_ids[: store.max_tokens // store.block_size * store.block_size])
    with store.lock:
        return store.cache.match(hashes) * store.block_size
