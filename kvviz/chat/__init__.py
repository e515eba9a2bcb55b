"""Multi-turn chat: a conversation's history through a chat template, and what each turn reused."""
