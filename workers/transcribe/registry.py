"""Engines by name: adding an engine is one new module and one line here, or an entry point."""

from __future__ import annotations

from importlib.metadata import entry_points

SEQUENTIAL_ENGINE = "faster-whisper"
BATCHED_ENGINE = "faster-whisper-batched"
# An engine shipped in a distribution of its own registers here (``whisper-cpp = switchyard_whispercpp:Engine``)
# and touches no module of this repository, as a provider does in ``switchyard.providers``; the capacity
# bench plugs its engine that takes no time in this way (``bench/plugins``).
ENTRY_POINT_GROUP = "switchyard.engines"

# "module:Class" strings, not classes: naming the engines (settings validation, docs, the bridge's start-up
# check) imports no engine module, and a process loads only the engine it runs. Each class is called as
# ``Class(settings, pool_processes)`` and satisfies ``workers.transcribe.protocol.TranscriptionEngine``.
ENGINES: dict[str, str] = {
    SEQUENTIAL_ENGINE: "workers.transcribe.whisper:WhisperEngine",
    BATCHED_ENGINE: "workers.transcribe.batched:BatchedWhisperEngine",
}


def engine_names() -> list[str]:
    """Every engine this installation can build (built-in and entry points)."""
    return sorted({*ENGINES, *(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))})


def engine_target(name: str) -> str:
    """``"module:Class"`` of the engine registered as ``name`` (``KeyError`` if none is)."""
    if name in ENGINES:
        return ENGINES[name]
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            return str(ep.value)
    raise KeyError(name)
