"""Engines by name: adding an engine is one new module and one line here.

Entries are ``"module:Class"`` strings rather than imported classes so that
naming the engines (settings validation, docs, the bridge's start-up check)
imports no engine module, and a process loads only the engine it runs
(``workers.transcribe.engine.engine_class``). A class listed here is called as
``Class(settings, pool_processes)`` and satisfies
``workers.transcribe.protocol.TranscriptionEngine``.
"""

from __future__ import annotations

SEQUENTIAL_ENGINE = "faster-whisper"
BATCHED_ENGINE = "faster-whisper-batched"

ENGINES: dict[str, str] = {
    SEQUENTIAL_ENGINE: "workers.transcribe.whisper:WhisperEngine",
    BATCHED_ENGINE: "workers.transcribe.batched:BatchedWhisperEngine",
}
