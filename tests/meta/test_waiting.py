"""A wait that times out says where every other thread of the test's process stands (tests/kit/waiting.py)."""

from __future__ import annotations

import threading

import pytest

from tests.kit.waiting import wait_until


def _held_fake_handler(release: threading.Event) -> None:
    release.wait(30)  # a fake's request handler that never answers


def test_a_timeout_names_each_other_thread_and_the_frame_that_holds_it() -> None:
    release = threading.Event()
    fake = threading.Thread(target=_held_fake_handler, args=(release,), name="fake-stalled")
    fake.start()
    try:
        with pytest.raises(AssertionError) as raised:
            wait_until(lambda: None, 0.1, "a job the stalled fake holds")
    finally:
        release.set()
        fake.join()
    assert str(raised.value) == "timed out after 0.1s waiting for a job the stalled fake holds"
    note = "\n".join(raised.value.__notes__)
    assert "thread 'fake-stalled':" in note and "in _held_fake_handler" in note, note
    assert "release.wait(30)" in note, note
    assert "thread 'MainThread'" not in note, note  # the waiting thread's own stack is the traceback itself


def test_a_wait_that_succeeds_returns_the_value() -> None:
    seen = iter([None, 0, "ready"])
    assert wait_until(lambda: next(seen), 5.0, "ready", interval_s=0.001) == "ready"
