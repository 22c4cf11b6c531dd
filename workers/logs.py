"""Logging set-up with one redaction filter for every handler."""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import traceback

from pythonjsonlogger.json import JsonFormatter

_SECRETS: set[str] = set()
_LOCK = threading.Lock()
MIN_SECRET_LEN = 6  # shorter values would redact ordinary words

# Shapes that are secret whatever their value: Telegram bot tokens in URL paths,
# bearer headers, presigned URL query signatures and credentials, OAuth codes.
_VALUE = r"[^&\s\"']+"  # a query or form value: up to the next pair, blank or quote
# An OAuth authorization code is a ``code`` pair of a URL query or fragment (after ``?``, ``&``, ``#``
# or ``;``) or of a form body (a pair followed by ``&``: a token request always has several). A bare
# ``code=404`` is nobody's secret: NATS names its errors ``code=404 err_code=10014``.
_OAUTH_CODE = r"(?<=[?&#;])code=|(?<![\w-])code=(?=" + _VALUE + r"&)"
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"/bot[0-9]+:[A-Za-z0-9_-]+"), "/bot<redacted>"),
    (re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]+"), r"\1<redacted>"),
    (
        re.compile(
            r"(?i)((?:X-Amz-Signature|X-Amz-Credential|X-Amz-Security-Token|Signature|"
            r"AWSAccessKeyId|access_token|refresh_token|client_secret)=|" + _OAUTH_CODE + ")" + _VALUE
        ),
        r"\1<redacted>",
    ),
)
REDACTED = "<redacted>"
DESCRIBE_MAX_CHARS = 300  # an exception's message in a one-line log entry


def register_secret(value: str | None) -> None:
    """Remember a secret value so every later log line, error and result drops it."""
    if value and len(value) >= MIN_SECRET_LEN:
        with _LOCK:
            _SECRETS.add(value)


def redact(text: str) -> str:
    """Return ``text`` with every registered secret and secret-shaped fragment removed."""
    if not text:
        return text
    with _LOCK:
        secrets = sorted(_SECRETS, key=len, reverse=True)
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, REDACTED)
    for pattern, repl in _PATTERNS:
        text = pattern.sub(repl, text)
    return text


def describe(exc: BaseException, max_chars: int = DESCRIBE_MAX_CHARS) -> str:
    """``Type: message`` (redacted, cut at ``max_chars``), or the type alone when it has no message.

    For lines that log an exception without its traceback: the type alone
    (``AttributeError``) hides which attribute, which host, which subject.
    """
    message = redact(str(exc)).strip()
    if not message:
        return type(exc).__name__
    if len(message) > max_chars:
        message = message[:max_chars] + "…"
    return f"{type(exc).__name__}: {message}"


class RedactingFilter(logging.Filter):
    """Render the message once, redact it, and freeze it so handlers see only the safe text."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string must not kill logging
            message = str(record.msg)
        record.msg = redact(message)
        record.args = None
        if record.exc_info and record.exc_info[1] is not None:
            record.exc_text = redact("".join(traceback.format_exception(*record.exc_info)))
            record.exc_info = None
        for key, value in list(record.__dict__.items()):
            if key not in _STD_ATTRS and isinstance(value, str):
                setattr(record, key, redact(value))
        return True


_STD_ATTRS = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}

HUMAN_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
# httpx logs each request URL at INFO, and a Telegram file URL carries the bot token in its path:
# these loggers are quieted to WARNING, and every record still goes through ``redact``.
NOISY_LOGGERS = ("httpx", "httpcore", "botocore", "urllib3", "nats", "asyncio")


def install_filter(handler: logging.Handler) -> None:
    """Attach the redaction filter to ``handler`` unless it already has one."""
    if not any(isinstance(f, RedactingFilter) for f in handler.filters):
        handler.addFilter(RedactingFilter())


def _formatter() -> logging.Formatter:
    if os.environ.get("LOG_FORMAT", "").lower() == "json":
        return JsonFormatter("%(asctime)s %(levelname)s %(name)s %(processName)s %(message)s")
    return logging.Formatter(HUMAN_FORMAT)


def adopt_handlers(logger: logging.Logger) -> None:
    """Make handlers someone else installed (Celery's) redact, and speak JSON under ``LOG_FORMAT=json``.

    Celery workers and beat configure their own handlers on the root and task
    loggers; we keep those (their human format names the process and task) and
    only add the filter, or swap in the JSON formatter when JSON is asked for.
    """
    json_wanted = os.environ.get("LOG_FORMAT", "").lower() == "json"
    for handler in logger.handlers:
        install_filter(handler)
        if json_wanted:
            handler.setFormatter(_formatter())


def setup_logging(level: str | int | None = None, *, own_handler: bool = True) -> None:
    """Configure the root logger once per process: redaction on every handler.

    ``own_handler=False`` is for processes whose handlers Celery installed (a
    pool child after the fork): adding ours there would print every record
    twice, once through Celery's handler and once through ours into Celery's
    stderr proxy, which re-logs it as a WARNING.
    """
    level = level or os.environ.get("LOG_LEVEL", "INFO")
    root = logging.getLogger()
    if own_handler and not any(getattr(h, "_switchyard", False) for h in root.handlers):
        own = logging.StreamHandler(sys.stderr)
        own._switchyard = True  # type: ignore[attr-defined]
        own.setFormatter(_formatter())
        root.addHandler(own)
    for handler in root.handlers:
        install_filter(handler)
    if own_handler:  # otherwise the level is Celery's (``-l``)
        root.setLevel(level)
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
