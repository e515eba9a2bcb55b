"""One message at a time: a new error or warning replaces the ones about earlier actions.

Gradio groups its toasts by kind and keeps each for ten seconds, so two bad inputs in a row read
"Error (2)" with the first, already fixed, message still on top. Gradio has no setting for this (a
toast's ``duration`` only shortens its life), so :data:`HEAD` adds a small script to the page: an action
(a click or a changed value outside the toasts) closes the open toasts through their own close buttons,
which removes them from Gradio's list, so they never come back; a message that arrives while others are
still up (a slow run failing after a later click) closes the other kinds and hides the older messages
of its own kind.
"""

from __future__ import annotations

TOASTS_JS = """
(() => {
  if (window.kvvizToasts) return;
  const groups = () => [...document.querySelectorAll('.toast-wrap .toast-item')];
  const close = (keep) => {
    for (const g of groups()) if (g !== keep) { const b = g.querySelector('[data-testid=toast-close]'); if (b) b.click(); }
  };
  const action = (e) => {
    if (!e.isTrusted || !(e.target instanceof Element) || e.target.closest('.toast-wrap')) return;
    close(null);
  };
  document.addEventListener('click', action, true);
  document.addEventListener('change', action, true);
  const seen = new WeakSet(), items = document.getElementsByClassName('toast-message-item');
  const newest = () => {
    const fresh = [...items].filter((i) => !seen.has(i));
    if (!fresh.length) return;
    for (const i of items) seen.add(i);
    const last = fresh[fresh.length - 1], group = last.closest('.toast-item');
    close(group);
    if (!group) return;
    for (const i of group.querySelectorAll('.toast-message-item')) if (i !== last) i.style.display = 'none';
    for (const s of group.querySelectorAll('.toast-separator, .toast-count')) s.style.display = 'none';
  };
  new MutationObserver(newest).observe(document.documentElement, {childList: true, subtree: true});
  window.kvvizToasts = true;
})();
"""
HEAD = f"<script>{TOASTS_JS}</script>"
