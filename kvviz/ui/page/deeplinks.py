"""Deep links: ``?tab=memory&config=DeepSeek-V3&context=131072`` opens a view with its main settings.

A link is read once when the page loads; each value is checked against the control it sets (a
dropdown's own choices, a slider's own range, a number's bound in :mod:`kvviz.limits`) and anything
unknown, out of range or malformed is left out with a note on the page — a link is text from strangers.
"Copy link" writes the link of the current view: the open tab and that tab's settings.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import gradio as gr

from kvviz.limits import MAX_BUDGET_TOKENS, bounded_int, calculator_number
from kvviz.ui.page import tab_switch
from kvviz.ui.serving.context import AppContext

MAX_PARAM_CHARS = 200  # longer values are refused before parsing
# URL parameter → the component it sets, per tab (the tab's slug is its module name without "tab_")
PARAMS: dict[str, dict[str, str]] = {
    "memory": {"config": "memory.preset", "context": "memory.context", "batch": "memory.batch"},
    "eviction": {"policy": "eviction.policy", "budget": "eviction.budget"},
    "attention": {"layer": "attention.layer", "head": "attention.head"},
}
# numbers whose bound is not the component's own: the same checks the tabs' handlers apply
NUMBER_CHECKS: dict[str, Callable[[Any], int | float]] = {
    "memory.context": lambda v: calculator_number("context", v, "context"),
    "memory.batch": lambda v: calculator_number("batch", v, "batch"),
    "eviction.budget": lambda v: bounded_int(_number(v, "budget"), "budget", 1, MAX_BUDGET_TOKENS),
}
OTHER_PARAMS = {"tab", "present", "__theme", "view"}  # read elsewhere (or by Gradio itself)


@dataclass
class Link:
    """What a link asks for, after checking: the tab's id, component values by key, and notes."""

    tab: str | None = None
    values: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _shown(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:37] + "…")


def _number(value: str, what: str) -> float:
    try:
        number = float(value.strip())
    except ValueError:
        raise ValueError(f"{what} must be a number; got {_shown(value)}.") from None
    if not math.isfinite(number):
        raise ValueError(f"{what} must be a finite number; got {_shown(value)}.")
    return number


def _choice(component: Any, value: str, name: str) -> Any:
    """``value`` as one of a dropdown's choices (matched on its value or its label)."""
    for choice in component.choices or []:
        label, val = choice if isinstance(choice, (tuple, list)) else (choice, choice)
        if str(val) == value or str(label) == value:
            return val
    raise ValueError(f"{name} = {_shown(value)} is not one of the choices.")


def check_value(key: str, component: Any, value: str, name: str) -> Any:
    """One URL value as the component's value, or a ValueError saying why it is left out."""
    if len(value) > MAX_PARAM_CHARS:
        raise ValueError(f"{name} is longer than {MAX_PARAM_CHARS} characters.")
    if key in NUMBER_CHECKS:
        return NUMBER_CHECKS[key](value)
    if isinstance(component, gr.Dropdown):
        return _choice(component, value, name)
    if isinstance(component, gr.Slider):
        lo, hi = int(component.minimum), int(component.maximum)
        return bounded_int(_number(value, name), name, lo, hi)
    raise ValueError(f"{name} cannot be set from a link.")


def parse_link(query: Mapping[str, str], components: Mapping[str, Any], tab_ids: list[str]) -> Link:
    """Check every parameter of a link against the controls this build has (never raises)."""
    link = Link()
    slug = (query.get("tab") or "").strip().lower()
    if slug:
        if f"tab_{slug}" in tab_ids and len(slug) <= 40:
            link.tab = f"tab_{slug}"
        else:
            link.notes.append(f"tab = {_shown(slug)} is not a view of this app.")
    allowed = PARAMS.get(slug, {}) if link.tab else {}
    for name, raw in query.items():
        if name in OTHER_PARAMS:
            continue
        key = allowed.get(name)
        if key is None or key not in components:
            where = f"the {slug} view" if link.tab else "a link without a known tab"
            link.notes.append(f"{_shown(name)[:44]} is not a setting of {where}.")
            continue
        try:
            link.values[key] = check_value(key, components[key], str(raw), name)
        except (ValueError, TypeError, OverflowError) as exc:
            link.notes.append(str(exc))
    return link


def make_link(base: str, tab: str | None, values: Mapping[str, Any]) -> str:
    """The URL of a view: ``base?tab=<slug>&<param>=<value>…`` for the tab's own settings."""
    slug = (tab or "").removeprefix("tab_")
    params: dict[str, str] = {"tab": slug} if slug else {}
    for name, key in PARAMS.get(slug, {}).items():
        value = values.get(key)
        if value is None or value == "":
            continue
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        params[name] = str(value)
    return base + ("?" + urlencode(params) if params else "")


def note_text(notes: list[str]) -> str:
    """The note shown under the title when a link had values that were left out, as HTML whose every character
    of the link is plain text: a link is written by whoever sends it, and the page must not lend it its voice
    (no link, image, markup or style made of ``?tab=[log in](http://…)`` or ``<img src=…>``)."""
    if not notes:
        return ""
    text = " ".join(notes[:8]) + (" …" if len(notes) > 8 else "")
    return f"<p>⚠ <strong>Parts of this link were ignored:</strong> {html.escape(text)}</p>"


# the open tab (its button's text) and the page's address, read in the browser for "Copy link"
COPY_JS = """(base, tab, ...values) => {
  const open = document.querySelector('.tab-wrapper button[role=tab][aria-selected=true]');
  return [window.location.origin + window.location.pathname, open ? open.innerText.trim() : '', ...values];
}"""
CLIPBOARD_JS = "(url) => { try { navigator.clipboard.writeText(url); } catch (e) {} return []; }"


@dataclass
class LinkBar:
    """The page's link row (built above the tabs, wired after them)."""

    url: gr.Textbox
    copy: gr.Button
    open_tab: gr.Textbox
    note: gr.Markdown


def bar() -> LinkBar:
    """The note about a link's ignored parts, and "Copy link" with the link it made."""
    note = gr.HTML(elem_id="link-note")  # the note's text escaped: nothing in a link renders as markup
    with gr.Row(equal_height=True):
        url = gr.Textbox(
            label="Link to this view",
            elem_id="link-url",
            interactive=False,
            scale=4,
            placeholder="Copy link puts a link that reopens this view here",  # hidden while empty (app.CSS)
        )
        copy = gr.Button("🔗 Copy link", elem_id="copy-link", size="sm", scale=0, min_width=140)
    return LinkBar(url, copy, gr.Textbox(visible=False), note)


def install(ctx: AppContext, demo: gr.Blocks, links: LinkBar, titles: Mapping[str, str]) -> None:
    """Read a link on page load and wire "Copy link" (``titles``: tab title → tab id)."""
    assert ctx.tabs is not None, "deep links are installed after the tabs"
    keys = sorted({k for spec in PARAMS.values() for k in spec.values() if k in ctx.components})
    comps = [ctx.components[k] for k in keys]
    tab_ids = list(titles.values())

    def read(request: gr.Request) -> list:
        query = dict(request.query_params) if request else {}
        link = parse_link(query, ctx.components, tab_ids)
        # a lecture opens on the lesson: ?present=1 without a tab selects Learn, not the first tab (Generate)
        lecture = query.get("present") == "1" and "tab_learn" in tab_ids
        tab = link.tab or ("tab_learn" if lecture else None)
        return [tab or "", *[link.values.get(k, gr.skip()) for k in keys], note_text(link.notes)]

    assert ctx.tab_box is not None, "the tab box is built with the tabs"
    opened = demo.load(
        read, None, [ctx.tab_box, *comps, links.note], api_name=False, queue=False, show_progress="hidden"
    )
    tab_switch.open_after(opened, ctx.tabs, ctx.tab_box)

    def build(base: str, title: str, *values) -> str:
        return make_link(str(base or ""), titles.get(str(title or "")), dict(zip(keys, values)))

    links.copy.click(
        build, [links.url, links.open_tab, *comps], links.url, js=COPY_JS, api_name=False, queue=False
    ).then(None, links.url, None, js=CLIPBOARD_JS, api_name=False, queue=False)
