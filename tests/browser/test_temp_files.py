"""Files stay in the temporary folder and go away: a public-mode server run from a private TMPDIR.

A user's exports land in that session's own folder under the server's temporary folder, and
stopping the server (SIGTERM, as a Space restart does) leaves the folder empty.
"""

from __future__ import annotations

import re

from tests.server import start_app, stop_app


def files_under(folder) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def test_exports_live_in_the_temp_folder_and_are_removed_at_shutdown(browser_context, tmp_path):
    app = start_app(tmp_path, extra_env={"KVVIZ_PUBLIC": "1"})
    try:
        tab = browser_context.new_page()
        tab.goto(app.url, wait_until="load")
        tab.locator("#prompt textarea").fill("The capital of France is")
        box = tab.get_by_label("number input for Max new tokens")
        box.fill("3")
        box.press("Enter")
        tab.locator("#generate-btn").click()
        tab.locator("#gen-status").get_by_text(re.compile(r"^Done")).wait_for(timeout=120_000)
        tab.locator("#gen-csv a[download='kvviz-steps.csv']").wait_for(timeout=30_000)  # written just after "Done"
        written = files_under(app.temp_dir)
        ours = [f for f in written if f.startswith("kvviz-")]
        # kvviz-<app>/<hashed session>/run-<id>/kvviz-steps.csv: per app, per session, per run
        assert any(re.fullmatch(r"kvviz-[^/]+/[0-9a-f]{24}/run-[^/]+/kvviz-steps\.csv", f) for f in ours), written
        assert any(f.endswith("kvviz-trace.npz") for f in ours)
        tab.close()
    finally:
        stop_app(app.proc)
    assert app.proc.returncode == 0, app.log()[-2000:]
    assert files_under(app.temp_dir) == [], "files left behind after shutdown"
