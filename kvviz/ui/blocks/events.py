"""Blocks tab section: the engine's KV events in vLLM's schema, exported as JSON Lines, and an event log imported.

The export is the prefix store's log (:meth:`kvviz.engine.prefix.PrefixStore.kv_events`, the same text as the
``/kv-events`` endpoint mounted in :func:`kvviz.ui.app.serve`); an imported log — kvviz's own, or one vLLM wrote
in that schema — is replayed (:func:`kvviz.engine.kv_events.replay`) and drawn as the live cache's tree is
(:func:`kvviz.figures.blocks_room.room_tree`). In a public deployment the export is the viewer's, as the live view.
"""

from __future__ import annotations

from pathlib import Path

import gradio as gr

from kvviz.engine.kv_events import replay
from kvviz.engine.prefix import BlockInfo, StoreView
from kvviz.figures import blocks_room as fig
from kvviz.limits import MAX_EVENT_LOG_BYTES
from kvviz.ui.page.widgets import captioned_plot
from kvviz.ui.serving.context import AppContext
from kvviz.ui.serving.identity import session_of
from kvviz.ui.serving.jobs import UserError
from kvviz.ui.serving.sessions import user_errors

NO_STORE = "This model's runs cannot be packed, so the engine keeps no prefix cache and has no KV events."


def export_text(ctx: AppContext, viewer: str | None) -> str:
    """The store's KV events as JSON Lines (empty when the engine keeps no prefix cache)."""
    store = ctx.engine.prefix
    return "" if store is None else store.kv_events(viewer, private=ctx.settings.public)


def imported_view(text: str) -> StoreView:
    """An event log's blocks at its end, as a view the blocks figures draw (no reference counts, hits or bytes)."""
    blocks = [BlockInfo(b.block_hash, b.parent, b.start, b.token_ids, 0, 0, 0) for b in replay(text)]
    return StoreView(blocks, {"blocks": len(blocks)})


def build(ctx: AppContext, decode) -> None:
    """Export and import buttons, and the imported log's tree."""
    gr.Markdown(
        "#### KV events\nThe cache's changes in vLLM's KV event schema (BlockStored, BlockRemoved, AllBlocksCleared), "
        "as routers and trace tools read them; also at `/kv-events`. Import a log (kvviz's or vLLM's) to see its "
        "prefix tree."
    )
    with gr.Row():
        export = gr.DownloadButton("Export KV events (JSONL)", elem_id="room-events-export", size="sm")
        upload = gr.UploadButton(
            "Import a KV event log", file_types=[".jsonl", ".json", ".txt"], elem_id="room-events-import", size="sm"
        )
    note = gr.Markdown(elem_id="room-events-note")
    tree = captioned_plot("Imported log: cached blocks by prefix", "room-events-tree", fig.CAPTIONS["tree"])

    def exported(request: gr.Request):
        if ctx.engine.prefix is None:
            raise UserError(NO_STORE)
        text = export_text(ctx, session_of(request))
        path = ctx.session_dir(request) / "kvviz-kv-events.jsonl"
        path.write_text(text)
        return str(path)

    def imported(file):
        with user_errors():
            path = Path(file if isinstance(file, str) else file.name)
            if path.stat().st_size > MAX_EVENT_LOG_BYTES:
                raise ValueError(f"The event log is larger than {MAX_EVENT_LOG_BYTES // 2**20} MiB.")
            view = imported_view(path.read_text(errors="replace"))
        texts = [decode(b.token_ids) if b.token_ids else "" for b in view.blocks]
        return f"{len(view.blocks)} blocks cached at the end of the imported log.", fig.room_tree(view, texts)

    export.click(exported, None, export, api_name=False, show_progress="hidden")
    upload.upload(imported, upload, [note, tree], api_name=False, show_progress="hidden")
