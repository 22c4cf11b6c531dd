"""The ``model`` marker, enforced: a test not marked ``model`` (or ``slow``) may not load a Whisper model.

``make check`` leaves ``model`` tests out because loading tiny.en and decoding with it costs seconds
of CPU per test; three unmarked tests of test_engine_words once put 30 CPU-s into the fast tier. So,
as ``fleet_guard`` does for fleet processes, this plugin counts ``faster_whisper.WhisperModel``
constructions in the pytest process while an unmarked test sets up and runs (a module-scoped engine
fixture loads it in the first test's setup) and fails the test naming the marker. Models loaded by
a fleet process it starts are ``fleet_guard``'s to catch (such a test is ``slow``).

The count wraps ``WhisperModel.__init__`` (it still calls the original) once faster_whisper is
imported, which collection does for every module that imports an engine: importing it here would
break the tests that check an engine module loads nothing at import.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

WHISPER_MODULE = "faster_whisper"
_loads = [0]  # WhisperModel constructions in this process so far
_BEFORE = pytest.StashKey[int]()  # the count when a test's setup began


def _count_loads() -> None:
    """Wrap ``WhisperModel.__init__`` once, if faster_whisper is imported by now."""
    module = sys.modules.get(WHISPER_MODULE)
    model = getattr(module, "WhisperModel", None)
    if model is None or getattr(model.__init__, "_counted", False):
        return
    original: Callable[..., None] = model.__init__

    @functools.wraps(original)
    def counted(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        _loads[0] += 1  # loaded: a name the host lacks fails fast and costs nothing

    counted._counted = True  # type: ignore[attr-defined]
    model.__init__ = counted


def _exempt(item: pytest.Item) -> bool:
    return item.get_closest_marker("model") is not None or item.get_closest_marker("slow") is not None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    _count_loads()
    item.stash[_BEFORE] = _loads[0]
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    result = yield  # a failing test raises here: its own failure is the one reported
    if not _exempt(item) and _loads[0] > item.stash.get(_BEFORE, _loads[0]):
        pytest.fail("this test loaded a Whisper model, so it must be marked model "
                    "(@pytest.mark.model or a module's pytestmark)", pytrace=False)
    return result

