"""Which language a transcription runs in, and which codes faster-whisper accepts."""

from __future__ import annotations

import importlib.util
import logging
import re
from collections.abc import Collection
from functools import lru_cache
from pathlib import Path
from types import ModuleType

log = logging.getLogger(__name__)

_SUBTAG_SEPARATOR = re.compile(r"[-_]")
MAX_LOGGED_HINT_CHARS = 32  # a hint is job data: log a short, quoted prefix only
TOKENIZER_FILE = "tokenizer.py"  # faster-whisper's module holding the language table
LANGUAGE_TABLE = "_LANGUAGE_CODES"
TABLE_MODULE = "_switchyard_whisper_languages"  # the private name it is loaded under (never faster_whisper's own)


def normalize(code: str) -> str:
    """``" en-US "`` → ``"en"``: trimmed, lower-cased, primary subtag only."""
    return _SUBTAG_SEPARATOR.split(code.strip().lower(), maxsplit=1)[0]


@lru_cache(maxsize=1)
def whisper_languages() -> frozenset[str]:
    """Every code faster-whisper's tokenizer accepts for a multilingual model.

    Why checked at all: a multilingual model raises ``ValueError`` for a code
    outside this list, deterministically, so a retry would only decode the
    same media again; ``VOICY_WORKER_LANGUAGE`` is checked against it at
    start-up instead (``workers.transcribe.settings``).

    faster-whisper keeps the list in ``faster_whisper.tokenizer._LANGUAGE_CODES``
    (a loaded model exposes the same list as ``supported_languages``, but
    start-up validation must not need a model).
    """
    return frozenset(getattr(_tokenizer_module(), LANGUAGE_TABLE))


def _tokenizer_module() -> ModuleType:
    """faster-whisper's ``tokenizer.py``, loaded on its own under a private name.

    Why not ``import faster_whisper.tokenizer``: that runs the package's
    ``__init__``, which loads CTranslate2 and numpy (~240 ms), and with them
    the thread pools that read their size once, at load
    (``workers.transcribe.host_threads``). Checking ``VOICY_WORKER_LANGUAGE``
    happens at start-up, in a Celery parent before it forks its gpu pool, so
    it must load neither. The file itself imports only ``tokenizers``.
    """
    package = importlib.util.find_spec("faster_whisper")
    if package is None or not package.submodule_search_locations:
        raise ModuleNotFoundError("faster_whisper")
    path = Path(next(iter(package.submodule_search_locations))) / TOKENIZER_FILE
    spec = importlib.util.spec_from_file_location(TABLE_MODULE, path)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"faster_whisper/{TOKENIZER_FILE}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pick_language(hint: str | None, fallback: str | None, supported: Collection[str]) -> str | None:
    """The language to transcribe in: the job's hint if the model knows it, else ``fallback``.

    Voicy's order (reference/voicy.md §6.7). Codes are compared after
    :func:`normalize`, so a BCP 47 hint such as ``en-US`` means ``en``.
    ``None`` means "detect". ``fallback`` was validated at start-up; an
    English-only model turns any language into ``en`` by itself.
    """
    if hint and hint.strip():
        code = normalize(hint)
        if code in supported:
            return code
        log.info("language hint %r is not a language the model knows; using %s",
                 hint[:MAX_LOGGED_HINT_CHARS], fallback or "detection")
    return fallback
