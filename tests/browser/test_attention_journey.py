"""The Attention journey in a real browser: generate, open Attention, change layer and head, scrub a
step, and click a cell of the sink map to open that layer and head."""

from __future__ import annotations

import re

PROMPT = "What is the capital of France?"


def plot_title(page, elem_id: str) -> str:
    return page.locator(f"#{elem_id} .gtitle").first.text_content() or ""


def wait_title(page, elem_id: str, pattern: str, timeout_ms: int = 60_000) -> None:
    """Wait until the plotly title of ``#elem_id`` matches ``pattern`` (the handler has redrawn it)."""
    page.wait_for_function(
        """([id, pat]) => { const t = document.querySelector('#' + id + ' .gtitle');
                            return t && new RegExp(pat).test(t.textContent); }""",
        arg=[elem_id, pattern],
        timeout=timeout_ms,
    )


def set_number(page, elem_id: str, value: int) -> None:
    box = page.locator(f"#{elem_id} input[type=number]")
    box.fill(str(value))
    box.press("Enter")


def test_attention_journey(page, screenshot):
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))

    # generate a short answer on the Generate tab
    page.locator("#prompt textarea").fill(PROMPT)
    num = page.get_by_label("number input for Max new tokens")
    num.fill("10")
    num.press("Enter")
    page.locator("#generate-btn").click()
    page.locator("#gen-status").get_by_text(re.compile(r"^Done")).wait_for(timeout=180_000)

    # open Attention: the views fill in from the run that just finished
    page.get_by_role("tab", name="Attention").click()
    page.locator("#attn-heatmap .js-plotly-plot").wait_for(timeout=60_000)
    assert re.search(r"prompt \+ \d+ generated tokens", page.locator("#attn-status").inner_text())
    wait_title(page, "attn-heatmap", r"^Layer 20, query head 0 ")
    assert page.locator("#attn-tokens").get_by_text("sink").count() >= 1  # the legend and the marked tokens

    # change the layer, then the head
    set_number(page, "attn-layer", 5)
    wait_title(page, "attn-heatmap", r"^Layer 5, query head 0 ")
    page.locator("#attn-head input").click()
    page.get_by_role("option", name="q4 (KV head 1)").click()
    wait_title(page, "attn-heatmap", r"^Layer 5, query head 4 \(KV head 1\)")
    assert "shared with query heads 3, 5" in page.locator("#attn-group").inner_text()
    heat_cells = page.locator("#attn-heatmap .heatmaplayer image, #attn-heatmap .heatmaplayer path")
    assert heat_cells.count() >= 1, "the heatmap drew nothing"

    # scrub to decode step 3: the chart shows that step's query for all heads of layer 5
    set_number(page, "attn-step", 3)
    wait_title(page, "attn-step-chart", r"^Layer 5, step 3: query ")

    # click the sink-map cell of layer 6, query head q7 (column 0 is the layer number)
    page.locator('#attn-sink-table [data-testid="cell-6-8"]').click()
    wait_title(page, "attn-heatmap", r"^Layer 6, query head 7 \(KV head 2\)")
    assert page.locator("#attn-layer input[type=number]").input_value() == "6"
    wait_title(page, "attn-step-chart", r"^Layer 6, step 3: ")

    assert page.locator(".toast-body.error").count() == 0, "an error toast is shown"
    assert not errors, f"JavaScript errors in the page: {errors}"
    screenshot(page, "attention_journey")
