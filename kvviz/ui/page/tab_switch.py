"""Switching the page's tab after a server's answer, in the page: no server event names a tab bar or a tab.

Gradio keeps every component a server event reads or writes in the page's loading-status table for good, and at
the start and end of every later server event it reads back the value of each one and of everything drawn under
it. For the top tab bar that is the whole page: once one event had switched tabs (the link on page load did, on
every visit), each tab the visitor opened made every later click slower (the Blocks tab's example drew 2.2 s after
its click, 1.2 s without). So a handler that opens a tab writes the tab's id into a hidden box (:func:`box`, ""
for none) and a page-only step after it selects that tab (:func:`open_after`); a fixed target needs no box
(:func:`open_js`). Page-only steps set no loading status, and the guard test
(``tests/ui/page/test_page_load.py``) fails on any server event that names a tab bar or a tab.
"""

from __future__ import annotations

import json

import gradio as gr

# the page-only step's function: the box's tab id → the bar's update ("" leaves the bar as it is)
FROM_BOX_JS = "(tab) => [tab ? {__type__: 'update', selected: tab} : undefined]"
QUIET = {"api_name": False, "queue": False, "show_progress": "hidden"}


def box() -> gr.Textbox:
    """The hidden box a handler writes the tab to open into (one per app; built outside any tab bar)."""
    return gr.Textbox(visible=False, elem_id="kvviz-tab-to-open")


def open_js(tab: str) -> str:
    """A page-only step's function that selects ``tab`` (a tab id) of the bar it outputs to."""
    return f"() => [{{__type__: 'update', selected: {json.dumps(tab)}}}]"


def open_after(event, tabs: gr.Tabs, tab_box: gr.Textbox):
    """After ``event`` (whose handler wrote ``tab_box`` on every path): select the tab it names, in the page."""
    return event.then(None, tab_box, tabs, js=FROM_BOX_JS, **QUIET)
