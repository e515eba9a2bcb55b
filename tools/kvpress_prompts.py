"""Write tests/data/kvpress_prompts.json: the token ids the kvpress parity reference is run on.

Runs in the normal kvviz env (it needs kvviz's tokenizer and examples); the reference side,
``tools/kvpress_reference.py``, runs in a separate env with an older transformers and so reads the
ids from this file instead of importing kvviz::

    .venv/bin/python -m tools.kvpress_prompts
"""

from __future__ import annotations

import json
from pathlib import Path

from kvviz.capture.model_io import encode_prompt
from kvviz.examples import chapter_text, needle_prompt
from kvviz.models import load_model

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "kvpress_prompts.json"
CHAPTER_TOKENS = 300  # long enough for a 64-token SnapKV window at ratio 0.75, short enough for CI


def prompts() -> dict[str, dict]:
    """Name → description and token ids (the chat template applied where the app applies it)."""
    lm = load_model()
    needle = encode_prompt(lm, needle_prompt(), chat=True)
    chapter = encode_prompt(lm, chapter_text(), chat=False)[:CHAPTER_TOKENS]
    return {
        "needle_chat": {"source": "kvviz.examples.needle_prompt() through the chat template", "token_ids": needle},
        "chapter_300": {
            "source": f"first {CHAPTER_TOKENS} tokens of kvviz.examples.chapter_text(), no template",
            "token_ids": chapter,
        },
    }


def main() -> None:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"model": "SmolLM2-135M-Instruct (bundled)", "prompts": prompts()}) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
