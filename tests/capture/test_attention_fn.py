"""The capture held across one thread's steps: installed once for a busy spell, let go for a thread that
waits to hold the model unpatched."""

from __future__ import annotations

import threading
import time

from kvviz.capture import attention_fn
from kvviz.capture.attention_fn import Held, is_installed, unpatched


def test_a_held_capture_installs_once_across_holds_and_is_gone_once_released(lm, monkeypatch):
    installs = []
    real = attention_fn._install
    monkeypatch.setattr(attention_fn, "_install", lambda model: installs.append(1) or real(model))
    held = Held(lm.model)
    for _ in range(3):  # three steps of one busy spell
        held.hold()
        assert is_installed(lm.model)
    assert len(installs) == 1
    held.release()
    held.release()  # a second release is a no-op
    assert not is_installed(lm.model)


def test_a_held_capture_lets_a_thread_waiting_for_the_unpatched_model_in_at_the_next_hold(lm):
    held = Held(lm.model)
    held.hold()
    seen: list[tuple[bool, bool]] = []

    def check() -> None:  # another run's equivalence check
        with unpatched(lm.model, timeout=30.0) as alone:
            seen.append((alone, is_installed(lm.model)))

    waiter = threading.Thread(target=check)
    waiter.start()
    deadline = time.monotonic() + 10
    while not attention_fn._wanted.get(id(lm.model)) and time.monotonic() < deadline:
        time.sleep(0.005)
    assert attention_fn._wanted.get(id(lm.model)) == 1, "the check never came to wait for the model"
    held.hold()  # the next step: it lets go first, then installs again once the check is done
    waiter.join(10)
    assert seen == [(True, False)], "the waiting check did not get the model as loaded"
    assert is_installed(lm.model) and id(lm.model) not in attention_fn._wanted
    held.release()
    assert not is_installed(lm.model)
