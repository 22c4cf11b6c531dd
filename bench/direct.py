"""faster-whisper called directly, in a process of its own: the voicy bench's baselines.

``python -m bench.direct serve THREADS`` (baseline (a), the limit): loads the
model once, warms it up on the files of its first request line, then answers
each request line (a JSON list of paths) with one JSON line: wall and CPU
seconds of transcribing them back to back, each file's seconds and its text.

``python -m bench.direct once THREADS PATH`` (baseline (b), Voicy's adapter):
imports faster-whisper, loads the model and transcribes one file, then prints
its transcription seconds, as a fresh interpreter per job does (the caller
times the whole process: the rest is start-up).

Both run the engine the fleet's gpu process runs, built the same way
(``workers.transcribe.engine.create_engine`` with the default settings: the
tiny model, int8 on the CPU, local files only) with the thread count the
bench gives them, the one the fleet's gpu process resolves. For a recording
of one window that engine is faster-whisper's own ``transcribe`` with the
sequential engine's options (``workers.transcribe.whisper.decode_options``);
a longer one goes through the batched engine's windows, in the fleet and here
alike. Both run as separate
processes in a session of their own, started like the fleet's processes, so
the scheduler treats both sides alike (with autogroup, CPU time is shared
between sessions first).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from devstack.infra.stack import TINY_MODEL_DIR
from workers.transcribe.engine import create_engine
from workers.transcribe.protocol import TranscriptionEngine
from workers.transcribe.settings import EngineSettings

SERVE, ONCE = "serve", "once"


def _load(threads: int) -> TranscriptionEngine:
    return create_engine(EngineSettings(model=TINY_MODEL_DIR, device="cpu", cpu_threads=threads))


def _transcribe(engine: TranscriptionEngine, path: str) -> str:
    return engine.transcribe(Path(path)).text


def serve(threads: int) -> int:
    model = _load(threads)
    first = True
    for line in sys.stdin:
        paths = json.loads(line)
        if first:  # the warm-up: every code path and buffer touched once, like the fleet's warm-up jobs
            for path in paths:
                _transcribe(model, path)
            first = False
            print(json.dumps({"ready": True}), flush=True)
            continue
        wall, cpu = time.perf_counter(), time.process_time()
        per_file, texts = [], []
        for path in paths:
            started = time.perf_counter()
            texts.append(_transcribe(model, path))
            per_file.append(time.perf_counter() - started)
        print(json.dumps({"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu,
                          "per_file_s": per_file, "texts": texts}), flush=True)
    return 0


def once(threads: int, path: str) -> int:
    model = _load(threads)
    started = time.perf_counter()
    text = _transcribe(model, path)
    print(json.dumps({"transcribe_s": time.perf_counter() - started, "text": text}))
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == [SERVE] and len(argv) == 2:
        return serve(int(argv[1]))
    if argv[:1] == [ONCE] and len(argv) == 3:
        return once(int(argv[1]), argv[2])
    print("usage: python -m bench.direct serve THREADS | once THREADS PATH", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
