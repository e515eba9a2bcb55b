"""Page size costs reuse: the room's requests replayed through a prefix cache at 8 / 16 / 32 / 64-token blocks.

Run: ``.venv/bin/python bench/page_sizes.py``. The lecture room's requests (``kvviz/examples/room.py``:
the example all 24 students press, then three waves of each student's own question), through the bundled
model's chat template, replayed in order through a cache that never evicts
(:func:`kvviz.blocks.page_size.replay`): block hit rate, and per request the tokens shared with an earlier
request, reused, recomputed and lost to the partial page. Writes ``bench/results/page_sizes.json``.
"""

from __future__ import annotations

import json
import sys

from _common import RESULTS

from kvviz.blocks.page_size import replay
from kvviz.capture.model_io import encode_prompt
from kvviz.examples.room import room_requests
from kvviz.models import load_model


def main() -> int:
    lm = load_model()
    prompts = [encode_prompt(lm, p, True) for p in room_requests()]
    frame = replay(prompts)
    print(frame.to_string(index=False, float_format=lambda x: f"{x:.2f}"))
    report = {"model": lm.name, "requests": len(prompts), "chat": True, "rows": frame.to_dict(orient="records")}
    (RESULTS / "page_sizes.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
