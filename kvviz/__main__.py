"""Command line: ``python -m kvviz {trace,memory,evict,...} --help``.

Each sub-command lives in ``kvviz/commands/<name>.py`` with ``add_parser(subparsers)`` and
``run(args) -> int``; adding one is an import and one entry in ``COMMANDS``.
"""

from __future__ import annotations

import argparse
import os
import sys

from kvviz.commands import blocks, check, evict, memory, serve_sim, sweep, trace

COMMANDS = [trace, memory, evict, blocks, sweep, check, serve_sim]


def main(argv: list[str] | None = None) -> int:
    if not sys.stderr.isatty():  # piped or logged: an error is one line, not under a weight-loading bar
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        from transformers.utils import logging as hf_logging  # read that variable when the commands imported it

        hf_logging.disable_progress_bar()
    parser = argparse.ArgumentParser(prog="python -m kvviz", description="See a transformer's KV cache.")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in COMMANDS:
        module.add_parser(sub)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except (ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
