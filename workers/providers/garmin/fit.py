"""Garmin's original download → the FIT file inside → decoded messages (garmin-fit-sdk).

Why Garmin's own SDK: it is the reference decoder for the profile every Garmin
device writes (scale and offset, component expansion such as
``enhanced_speed``, sub-fields, merged heart rate), so the mapping reads
named, scaled values and never a byte layout.

Connect serves the original upload as a zip (``<id>_ACTIVITY.fit`` inside). A
download that is not a zip, holds no ``.fit``, or whose FIT fails the header,
CRC or decode, is :class:`CorruptFit`: permanent (the same bytes fail the same
way every time), so the job ends with a failure envelope instead of a loop.
An activity uploaded as GPX or TCX has no FIT original: ``unsupported_file``.
"""

from __future__ import annotations

import io
import zipfile
from typing import Any

from garmin_fit_sdk import Decoder, Stream

from workers.providers.errors import ProviderPermanentError

FIT_SUFFIX = ".fit"
FOREIGN_SUFFIXES = (".gpx", ".tcx", ".kml", ".csv")
MAX_FIT_BYTES = 64 * 1024 * 1024  # a FIT inside the zip above this is refused, whatever the zip claims
FIT_MAGIC = b".FIT"
FIT_MAGIC_OFFSET = 8


class CorruptFit(ProviderPermanentError):
    """The original file cannot be read as a FIT activity."""

    code = "corrupt_fit"


class UnsupportedFile(ProviderPermanentError):
    """The original upload is not a FIT file (a GPX or TCX upload)."""

    code = "unsupported_file"


def fit_from_download(body: bytes) -> bytes:
    """The FIT bytes of Connect's original-file download (a zip; a bare FIT is accepted too)."""
    if body[FIT_MAGIC_OFFSET:FIT_MAGIC_OFFSET + len(FIT_MAGIC)] == FIT_MAGIC:
        return body
    try:
        archive = zipfile.ZipFile(io.BytesIO(body))
        names = archive.namelist()
    except (zipfile.BadZipFile, OSError, ValueError):
        raise CorruptFit("the original download is neither a zip nor a FIT file") from None
    fits = sorted(n for n in names if n.lower().endswith(FIT_SUFFIX))
    if not fits:
        if any(n.lower().endswith(FOREIGN_SUFFIXES) for n in names):
            raise UnsupportedFile("the original upload is not a FIT file")
        raise CorruptFit("the original download holds no FIT file")
    info = archive.getinfo(fits[0])
    if info.file_size > MAX_FIT_BYTES:
        raise CorruptFit(f"the FIT file claims {info.file_size} bytes")
    try:
        with archive.open(info) as member:
            data = member.read(MAX_FIT_BYTES + 1)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        raise CorruptFit("the FIT file in the download is damaged") from None
    if len(data) > MAX_FIT_BYTES:
        raise CorruptFit("the FIT file exceeds the size bound")
    return data


def decode_fit(data: bytes) -> dict[str, list[dict[str, Any]]]:
    """Every message of an intact FIT file, by ``<name>_mesgs``; ``CorruptFit`` otherwise."""
    if not Decoder(Stream.from_byte_array(bytearray(data))).check_integrity():
        raise CorruptFit("not an intact FIT file (header, size or CRC)")
    try:
        messages, errors = Decoder(Stream.from_byte_array(bytearray(data))).read()
    except Exception as exc:  # noqa: BLE001 - the SDK raises plain errors on malformed input
        raise CorruptFit(f"FIT decoding failed: {type(exc).__name__}") from None
    if errors:
        raise CorruptFit(f"FIT decoding failed: {type(errors[0]).__name__}")
    if not messages.get("session_mesgs"):
        raise CorruptFit("the FIT file holds no session (not an activity)")
    return messages
