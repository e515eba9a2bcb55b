"""One message at a time: a new error or warning replaces the ones about earlier actions.

Gradio groups its toasts by kind and keeps each for ten seconds, so two bad inputs in a row read
"Error (2)" with the first, already fixed, message still on top. Gradio has no setting for this (a
toast's ``duration`` only shortens its life), so :data:`HEAD` adds a small script to the page: an action
(a click or a changed value outside the toasts) closes the open toasts through their own close buttons,
which removes them from Gradio's list, so they never come back; a message that arrives while others are
still up (a slow run failing after a later click) closes the other kinds and hides the older messages
of its own kind. A changed value counts from its first keystroke: the ``change`` a number box fires on
Enter or blur commits an edit whose message (typing already sent it) may be up by then, and must stay.
"""

from __future__ import annotations

TOASTS_JS = """
(() => {
  if (window.kvvizToasts) return;
  const groups = () => [...document.querySelectorAll('.toast-wrap .toast-item')];
  const born = new WeakMap(), edits = new WeakMap();  // a toast's newest message; an edit's first keystroke
  const close = (keep, before = Infinity) => {
    for (const g of groups()) {
      if (g === keep || (born.get(g) ?? 0) >= before) continue;
      const b = g.querySelector('[data-testid=toast-close]');
      if (b) b.click();
    }
  };
  const ours = (e) => e.isTrusted && e.target instanceof Element && !e.target.closest('.toast-wrap');
  document.addEventListener('input', (e) => { if (ours(e) && !edits.has(e.target)) edits.set(e.target, performance.now()); }, true);
  document.addEventListener('click', (e) => { if (ours(e)) close(null); }, true);
  document.addEventListener('change', (e) => {
    if (!ours(e)) return;
    const since = edits.get(e.target) ?? performance.now();
    edits.delete(e.target);
    close(null, since);
  }, true);
  const seen = new WeakSet(), items = document.getElementsByClassName('toast-message-item');
  const newest = () => {
    const fresh = [...items].filter((i) => !seen.has(i));
    if (!fresh.length) return;
    for (const i of items) seen.add(i);
    const last = fresh[fresh.length - 1], group = last.closest('.toast-item');
    close(group);
    if (!group) return;
    born.set(group, performance.now());
    for (const i of group.querySelectorAll('.toast-message-item')) if (i !== last) i.style.display = 'none';
    for (const s of group.querySelectorAll('.toast-separator, .toast-count')) s.style.display = 'none';
  };
  new MutationObserver(newest).observe(document.documentElement, {childList: true, subtree: true});
  window.kvvizToasts = true;
})();
"""
HEAD = f"<script>{TOASTS_JS}</script>"
