"""kvviz web app: ``python app.py [--model SPEC] [--host H] [--port P] [--share] [--root-path PATH]``.

Every option also reads an environment variable (KVVIZ_MODEL, KVVIZ_HOST, KVVIZ_PORT, KVVIZ_SHARE,
KVVIZ_ROOT_PATH, KVVIZ_DEVICE_MAP, …); flags win. ``--device-map auto`` spreads a model too big for one
device over the GPUs, the CPU and ``--offload-folder`` (accelerate), within ``--max-memory``. On a
Hugging Face Space the defaults serve the hub copy of SmolLM2.
Limits and the public mode come from the environment too (see ``kvviz/settings.py``); KVVIZ_MCP=1 (the default
on a Space) also serves the named endpoints as MCP tools at ``/gradio_api/mcp``.

SIGTERM (a Space restarting) or Ctrl-C stops the server, ends every model job (the engine's thread after its
current step), deletes the session folders and exits 0.
"""

from __future__ import annotations

import argparse
import atexit
import logging
import os
import signal
import sys
import threading
import time

from kvviz import openmp
from kvviz.commands.common import add_placement_args, placement
from kvviz.models import ModelLoadError, load_model, resolve_spec
from kvviz.process_memory import freeze_startup
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


SHUTDOWN_S = 5.0  # how long a stopping server waits for running model jobs to end


def load(args: argparse.Namespace):
    """The app's context: the settings and the model, checked against the public mode's allowlist first."""
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
    return AppContext(lm=lm, settings=settings)


def build(ctx, stop: threading.Event):
    """The app and its ``launch`` options; ``stop`` ends the start-up work in the background."""
    from kvviz.ui.app import build_app, serve
    from kvviz.ui.serving import precompute, sessions

    settings = ctx.settings
    logging.getLogger("kvviz").info("session files under %s (removed at exit)", ctx.files.root)
    demo = build_app(ctx)
    sessions.install(demo, ctx)
    precompute.restore(ctx)  # show-me results an earlier start stored: answered at once
    precompute.warm(ctx)  # the chat template's prefix blocks cached before the first request
    precompute.start(ctx, stop)  # the show-me examples, in the background while the server starts
    return demo, {**serve(demo, settings, ctx), "mcp_server": settings.mcp}


def _interrupt(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not interrupt the shutdown
    raise KeyboardInterrupt


def shutdown(demo, ctx, stop: threading.Event) -> None:
    """End the background work and every model job, stop the server, delete the session folders.

    Jobs first: a request still streaming holds the server's shutdown for its 5 s grace, and a thread still
    inside a torch forward when the interpreter exits aborts the process (``terminate called without an
    active exception``, exit code -6). A job that will not end within :data:`SHUTDOWN_S` is left behind by
    ``os._exit`` once the files are gone."""
    stop.set()
    stopped = ctx is None or ctx.close(SHUTDOWN_S)
    if demo is not None:
        demo.close(verbose=False)
    if not stopped:
        logging.getLogger("kvviz").warning("model work still running after %.0f s; exiting without it", SHUTDOWN_S)
        exit_now(0)


def exit_now(code: int) -> None:
    """Exit with ``code`` after the exit handlers (a share link's tunnel, the session folders) and flushed output,
    without the interpreter's teardown: freeing every object torch, gradio and the traces hold takes a served
    app several seconds, more than a restart's grace, and a thread left inside torch would abort it."""
    atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # one line per refused request (kvviz.ui.serving.jobs.UserError); real failures log their traceback
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpcore", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # SIGTERM (a Space restarting, a test ending) stops the app like Ctrl-C, at start-up too
    previous = signal.signal(signal.SIGTERM, _interrupt)
    stop = threading.Event()
    demo = ctx = None
    try:
        ctx = load(args)
        demo, launch_options = build(ctx, stop)
        from kvviz.ui.app import CSS, HEAD, THEME

        demo.launch(
            server_name=args.host,
            server_port=args.port,
            share=args.share,
            root_path=args.root_path,
            theme=THEME,
            css=CSS,
            head=HEAD,
            footer_links=["api"],
            prevent_thread_lock=True,
            **launch_options,
        )
        freeze_startup()  # the start-up's objects out of every later full collection (see there)
        openmp.release()  # this thread computes no more: its OpenMP workers would slow the engine's (see there)
        while demo.is_running:  # until SIGTERM or Ctrl-C raises KeyboardInterrupt here
            time.sleep(0.1)
    except ModelLoadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("Stopping: ending the running jobs, then the server.", flush=True)
    finally:
        shutdown(demo, ctx, stop)
        signal.signal(signal.SIGTERM, previous)
    return 0


if __name__ == "__main__":
    exit_now(main())
