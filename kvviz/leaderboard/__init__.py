"""The leaderboard: RULER-style retrieval tasks generated on the spot, a sweep of every policy over compression ratios."""
