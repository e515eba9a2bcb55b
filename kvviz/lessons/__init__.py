"""lessons."""
