"""What a Learn show-me does in the page once its values are set: open the sub-tabs its view is in, press its
button (unless its result came with the click), then bring its view into sight and outline it and its controls.

``__PRESS__`` (the button's element id or null), ``__ANCHOR__`` (the view's), ``__CONTROLS__`` (the controls it set)
and ``__SECTIONS__`` (``[bar element id, sub-tab title]`` pairs, :func:`kvviz.ui.page.sections.opening`) are filled
per show-me by :func:`kvviz.ui.learn.show_me_button`.
"""

PRESS_JS = """(mode) => {
  const press = mode === 'stored' ? null : __PRESS__, anchor = __ANCHOR__, controls = __CONTROLS__, t0 = Date.now();
  const sections = __SECTIONS__;
  const shown = (el) => el && el.getClientRects().length > 0;
  const spot = () => {  // once the view is on screen: bring it into sight and outline it and its controls
    const a = anchor ? document.getElementById(anchor) : null;
    if (!shown(a)) return Date.now() - t0 < 120000 ? setTimeout(spot, 100) : null;
    let moved = false;
    for (const ev of ['wheel', 'touchmove', 'mousedown']) addEventListener(ev, () => { moved = true; }, {once: true, passive: true});
    const centre = () => a.scrollIntoView({behavior: 'instant', block: a.offsetHeight > innerHeight ? 'start' : 'center'});
    const marked = [a, ...controls.map((id) => document.getElementById(id)).filter(shown)];
    for (const el of marked) { el.classList.remove('kvviz-spot'); void el.offsetWidth; el.classList.add('kvviz-spot'); }
    setTimeout(() => marked.forEach((el) => el.classList.remove('kvviz-spot')), 4000);
    let last = null;
    const settle = (since) => {  // results arriving move the layout: keep the view in sight until it settles
      if (moved || Date.now() - since > 6000) return;
      const r = a.getBoundingClientRect(), now = `${Math.round(r.top)}:${Math.round(r.height)}`;
      if (now !== last) { centre(); last = (() => { const q = a.getBoundingClientRect(); return `${Math.round(q.top)}:${Math.round(q.height)}`; })(); }
      setTimeout(() => settle(since), 150);
    };
    settle(Date.now());
  };
  const opened = () => {  // the sub-tabs (sections) the view is in: true once each is open, else click towards it
    let all = true;
    for (const [bar, title] of sections) {
      const root = document.getElementById(bar);
      const named = root ? [...root.querySelectorAll('button')].filter((b) => b.innerText.trim() === title) : [];
      if (named.some((b) => b.getAttribute('role') === 'tab' && b.getAttribute('aria-selected') === 'true')) continue;
      all = false;
      // the bar's own button, else the same title in its "More tabs" menu, else that menu's button
      const inBar = named.find((b) => b.getAttribute('role') === 'tab' && shown(b));
      const inMenu = named.find((b) => b.closest('.overflow-dropdown') && shown(b));
      const button = inBar || inMenu || (root && root.querySelector('button[aria-label="More tabs"]'));
      if (button) button.click();
    }
    return all;
  };
  const tick = () => {
    if (!opened() && Date.now() - t0 < 10000) return setTimeout(tick, 100);
    const el = press ? document.getElementById(press) : null;
    if (press && !el && Date.now() - t0 < 10000) return setTimeout(tick, 100);
    if (el) (el.tagName === 'BUTTON' ? el : (el.querySelector('button') || el)).click();
    spot();
  };
  setTimeout(tick, 150);
  return [];
}"""
