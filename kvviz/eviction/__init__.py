"""Eviction: policies that choose what each KV head keeps (policies/), a cache that really drops entries
(cache.py), generation under a policy (run.py), side-by-side comparison (compare.py) and demos (demos.py)."""
