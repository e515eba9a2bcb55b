"""The chapter's lessons computed live: objectives and questions (objectives.py), wasted work (waste.py),
cache vs no cache (nocache.py)."""
