"""What a shared prefix cache leaks: a second session's time to first token, with and without a hit, salted or not.

Run: ``.venv/bin/python bench/side_channel.py [--tokens 192] [--tries 3]``. The bundled model, in a prefix
store of its own (:func:`kvviz.engine.side_channel.measure`): per try a first session sends a slice of the
source chapter; a second sends the same slice and one nobody sent, each timed from its store look-up to its
first token; once in a shared store, once with per-session salts. Writes ``bench/results/side_channel.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from _common import RESULTS, chapter_prompt_ids

from kvviz.engine.side_channel import measure
from kvviz.models import load_model


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=192)
    ap.add_argument("--tries", type=int, default=3)
    args = ap.parse_args(argv)
    lm = load_model()
    leak = measure(lm, chapter_prompt_ids(lm.tokenizer, args.tokens + 2 * args.tries), args.tries)
    report = {
        "model": lm.name,
        "device": str(lm.device),
        "prompt_tokens": leak.prompt_tokens,
        "tries": leak.tries,
        "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg(),
        "ttft_s": leak.times,
        "median_ttft_s": {k: sorted(v)[len(v) // 2] for k, v in leak.times.items()},
        "guessed_right": {"shared": leak.guessed_right(False), "salted": leak.guessed_right(True)},
    }
    (RESULTS / "side_channel.json").write_text(json.dumps(report, indent=2) + "\n")
    for k, v in report["median_ttft_s"].items():
        print(f"median {k:12s} {v * 1000:8.0f} ms")
    print(
        f"second session guesses right: shared {leak.guessed_right(False):.0%}, salted {leak.guessed_right(True):.0%}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
