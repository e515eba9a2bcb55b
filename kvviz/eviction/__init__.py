"""eviction."""
