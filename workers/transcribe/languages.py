"""Which language a transcription runs in, and which codes faster-whisper accepts.

Why this exists: a multilingual Whisper model raises ``ValueError`` from
faster-whisper's tokenizer for a code outside its list (``'english' is not a
valid language code``). That error is deterministic, so retrying it only
re-downloads and re-decodes the same media three times. Instead:

* ``VOICY_WORKER_LANGUAGE`` is checked once, at start-up, against faster-whisper's
  own list (``ConfigError`` naming the variable, from ``workers.transcribe.settings``);
* a job's ``recognitionLanguageHint`` that the model does not know is skipped in
  Voicy's own order (reference/voicy.md §6.7: the job hint, else
  ``VOICY_WORKER_LANGUAGE``, else none): the fallback language, else detection.

Codes are compared after :func:`normalize`: trimmed, lower-cased, and cut to
the primary subtag, so a BCP 47 hint such as ``en-US`` or ``pt_BR`` means
``en``/``pt`` (Whisper's codes carry no region).

faster-whisper is imported only when a list is actually needed, so a process
that never validates a language (the bridge with no fallback language, beat)
does not pay for importing it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Collection
from functools import lru_cache

log = logging.getLogger(__name__)

_SUBTAG_SEPARATOR = re.compile(r"[-_]")
MAX_LOGGED_HINT_CHARS = 32  # a hint is job data: log a short, quoted prefix only


def normalize(code: str) -> str:
    """``" en-US "`` → ``"en"``: trimmed, lower-cased, primary subtag only."""
    return _SUBTAG_SEPARATOR.split(code.strip().lower(), maxsplit=1)[0]


@lru_cache(maxsize=1)
def whisper_languages() -> frozenset[str]:
    """Every code faster-whisper's tokenizer accepts for a multilingual model.

    faster-whisper keeps the list in ``faster_whisper.tokenizer._LANGUAGE_CODES``
    (a loaded model exposes the same list as ``supported_languages``, but
    start-up validation must not need a model).
    """
    # Function-level on purpose: faster_whisper (ctranslate2, PyAV; ~240 ms) loads only where a language
    # is checked, not in every process that reads the settings (the bridges, beat).
    from faster_whisper.tokenizer import _LANGUAGE_CODES

    return frozenset(_LANGUAGE_CODES)


def pick_language(hint: str | None, fallback: str | None, supported: Collection[str]) -> str | None:
    """The language to transcribe in: the job's hint if the model knows it, else ``fallback``.

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
