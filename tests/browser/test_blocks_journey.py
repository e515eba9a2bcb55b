"""The Blocks journey in a real browser: lay a run's cache into blocks, change the block size, scrub, share two
prompts' prefixes, count the blocks an eviction frees, follow a Generate run, read the engine's start-up log."""

from __future__ import annotations

import re


def _number(page, elem_id: str, value: str) -> None:
    box = page.locator(f"#{elem_id} input[type=number]").first
    box.fill(value)
    box.press("Enter")


def _title(page, elem_id: str, pattern: str, timeout_ms: int = 60_000) -> None:
    page.wait_for_function(
        """([id, pat]) => { const t = document.querySelector('#' + id + ' .gtitle');
                            return t && new RegExp(pat).test(t.textContent); }""",
        arg=[elem_id, pattern],
        timeout=timeout_ms,
    )


def test_blocks_journey(page, screenshot):
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.get_by_role("tab", name="Blocks").click()

    # the tab's own prompt: a short run, then the cache in 16-token blocks
    _number(page, "blocks-max-new", "6")
    page.locator("#blocks-run").click()
    page.locator("#blocks-status").get_by_text(re.compile("cache of this prompt")).wait_for(timeout=120_000)
    summary = page.locator("#blocks-summary")
    summary.get_by_text(re.compile(r"16 tokens × 46,080 B = 720 KiB")).wait_for(timeout=30_000)
    _title(page, "blocks-grid", r"tokens → \d+ blocks of 16 slots per layer and KV head · 30 layers × 3 KV heads")
    _title(page, "blocks-alloc", r"^Paging wastes")
    assert page.locator("#blocks-table").get_by_text("entries held").count() >= 1

    # smaller blocks, then back to the prefill with the scrubber
    page.locator("#blocks-size").get_by_label("8", exact=True).check()
    _title(page, "blocks-grid", r"blocks of 8 slots")
    _number(page, "blocks-step", "0")
    summary.get_by_text(re.compile("after the prefill")).wait_for(timeout=30_000)
    _number(page, "blocks-layer", "7")
    _title(page, "blocks-slots", r"^Layer 7: \d+ entries in \d+ blocks of 8 slots")

    # two students' prompts share the blocks of their common prefix (the section's sub-tab; the block size chosen
    # in the live view holds there too)
    page.get_by_role("tab", name="Prefix sharing").click()
    page.locator("#share-run").click()
    share = page.locator("#share-summary")
    share.get_by_text(re.compile(r"full blocks of 8\*?\*? in common")).wait_for(timeout=120_000)
    assert re.search(r"prefill tokens\*\* not recomputed", share.inner_text()) is None  # rendered, not raw markdown
    _title(page, "share-figure", r"logical blocks on \d+ physical blocks")
    assert page.locator("#share-table").get_by_text("found in prefix cache").count() >= 1

    # eviction meets paging: tokens evicted against blocks freed
    page.get_by_role("tab", name="Eviction × paging").click()
    _number(page, "evblocks-budget", "32")
    page.locator("#evblocks-run").click()
    page.locator("#evblocks-note").get_by_text(re.compile("Page-aligned policies free more")).wait_for(timeout=180_000)
    for name in ("StreamingLLM", "H2O", "SnapKV"):
        assert page.locator("#evblocks-table").get_by_text(name, exact=True).count() >= 1
    _title(page, "evblocks-grid", r"^H2O: [\d,]+ of [\d,]+ \(layer, head\) blocks freed")

    # a Generate run refreshes the view
    page.get_by_role("tab", name="Generate").click()
    num = page.get_by_label("number input for Max new tokens")
    num.fill("5")
    num.press("Enter")
    page.locator("#generate-btn").click()
    page.locator("#gen-status").get_by_text(re.compile(r"^Done")).wait_for(timeout=180_000)
    page.get_by_role("tab", name="Blocks").click()
    page.get_by_role("tab", name="Paging, live").click()  # the tab kept the sub-tab last opened
    page.locator("#blocks-status").get_by_text(re.compile("latest Generate run")).wait_for(timeout=60_000)

    # the engine's start-up log in the Memory tab
    page.get_by_role("tab", name="Memory").click()
    log = page.locator("#engine-log")
    log.get_by_text(re.compile(r"GPU KV cache size: 1,330,560 tokens")).wait_for(timeout=30_000)
    assert "162.42x" in log.inner_text() and "655,360 B" in log.inner_text()

    assert page.locator(".toast-body.error").count() == 0, "an error toast is shown"
    assert not errors, f"JavaScript errors in the page: {errors}"
    screenshot(page, "blocks_journey")
