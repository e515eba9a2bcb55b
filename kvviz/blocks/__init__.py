"""Paged view of the KV cache: blocks of the live cache, chained-hash prefix sharing, eviction × paging.

``hashing`` (chained block hashes) and ``prefix_cache`` (LRU, byte-bounded, reference-counted) are
the pieces a serving engine with a shared prefix cache reuses; ``table``, ``sharing`` and
``eviction`` are the arithmetic of the views; ``live`` runs the model for them.
"""
