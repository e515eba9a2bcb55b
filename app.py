"""kvviz web app: ``python app.py [--model SPEC] [--host H] [--port P] [--share] [--root-path PATH]``.

Every option also reads an environment variable (KVVIZ_MODEL, KVVIZ_HOST, KVVIZ_PORT, KVVIZ_SHARE,
KVVIZ_ROOT_PATH, KVVIZ_DEVICE_MAP, …); flags win. ``--device-map auto`` spreads a model too big for one
device over the GPUs, the CPU and ``--offload-folder`` (accelerate), within ``--max-memory``. On a
Hugging Face Space the defaults serve the hub copy of SmolLM2.
Limits and the public mode come from the environment too (see ``kvviz/settings.py``).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys

from kvviz.commands.common import add_placement_args, placement
from kvviz.models import ModelLoadError, load_model, resolve_spec
from kvviz.safety import check_model_spec, remove_stale
from kvviz.settings import Settings, env


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Serve the kvviz web app.")
    p.add_argument("--model", default=env("KVVIZ_MODEL"), help="bundled (default), a local folder, or a hub id")
    p.add_argument("--host", default=env("KVVIZ_HOST", "0.0.0.0" if env("SPACE_ID") else "127.0.0.1"))
    p.add_argument("--port", type=int, default=int(env("KVVIZ_PORT", env("GRADIO_SERVER_PORT", "7860"))))
    p.add_argument("--share", action="store_true", default=env("KVVIZ_SHARE", "") in {"1", "true"})
    p.add_argument("--root-path", default=env("KVVIZ_ROOT_PATH", env("GRADIO_ROOT_PATH")))
    p.add_argument("--device", default=env("KVVIZ_DEVICE"))
    p.add_argument("--dtype", default=env("KVVIZ_DTYPE"))
    add_placement_args(p, env)
    return p.parse_args(argv)


def build(args: argparse.Namespace):
    from kvviz.ui.app import build_app, serve
    from kvviz.ui.serving import precompute, sessions
    from kvviz.ui.serving.context import AppContext

    settings = Settings.from_env()
    for path in remove_stale():  # exports of an earlier server killed before its exit cleanup (kill -9)
        logging.getLogger("kvviz").info("removed a dead server's temp folder %s", path)
    spec = resolve_spec(args.model)
    try:  # a public deployment loads only its allowlist, never a local path
        check_model_spec(spec, public=settings.public, allowed=settings.allowed_models)
    except ValueError as exc:
        raise ModelLoadError(str(exc)) from None
    lm = load_model(spec, device=args.device, dtype=args.dtype, **placement(args))
    ctx = AppContext(lm=lm, settings=settings)
    demo = build_app(ctx)
    sessions.install(demo, ctx)
    precompute.warm(ctx)  # the chat template's prefix blocks cached before the first request
    precompute.start(ctx)  # the show-me examples, in the background while the server starts
    return demo, serve(demo, settings)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # one line per refused request (kvviz.ui.serving.jobs.UserError); real failures log their traceback
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpcore", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        demo, launch_options = build(args)
    except ModelLoadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from kvviz.ui.app import CSS, HEAD, THEME

    # SIGTERM (a Space restarting, a test ending) closes the server like Ctrl-C, so temp files are deleted
    signal.signal(signal.SIGTERM, _interrupt)
    demo.launch(
        server_name=args.host,
        server_port=args.port,
        share=args.share,
        root_path=args.root_path,
        theme=THEME,
        css=CSS,
        head=HEAD,
        footer_links=["api"],
        **launch_options,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
