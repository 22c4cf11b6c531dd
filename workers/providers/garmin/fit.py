"""Garmin's original download → the FIT file inside → decoded messages (fitdecode).

Connect serves the original upload as a zip (``<id>_ACTIVITY.fit`` inside). Every
failure here is permanent (the same bytes fail the same way every time), so the
job ends with a failure envelope instead of a loop; each names its true cause
(the reasons are listed in docs/operations.md, Garmin).
"""

from __future__ import annotations

import io
import struct
import zipfile
from typing import Any

import fitdecode
from fitdecode.exceptions import FitCRCError, FitEOFError, FitError, FitHeaderError, FitParseError
from fitdecode.types import DevField, SubField

from workers.providers.errors import ProviderPermanentError

FIT_SUFFIX = ".fit"
FOREIGN_SUFFIXES = (".gpx", ".tcx", ".kml", ".csv")
MAX_FIT_BYTES = 64 * 1024 * 1024  # a FIT inside the zip above this is refused, whatever the zip claims
FIT_MAGIC = b".FIT"
FIT_MAGIC_OFFSET = 8
SUPPORTED_PROTOCOL_MAJOR = 2  # FIT protocol 2.x (developer fields); a later major may change the record layout
MAX_REASON_CHARS = 160  # a decoder's own words in a failure message, bounded


class CorruptFit(ProviderPermanentError):
    """The file's header, size or CRC is broken (or the download holds no FIT at all)."""

    code = "corrupt_fit"


class MalformedFit(ProviderPermanentError):
    """Header, size and CRC are intact, but the records break the protocol (a data message with no definition)."""

    code = "malformed_fit"


class UnsupportedFitFeature(ProviderPermanentError):
    """An intact FIT file using a feature the decoder does not read; the message names the feature."""

    code = "unsupported_fit_feature"


class NotAnActivity(ProviderPermanentError):
    """A readable FIT file with no session: a course, workout or monitoring file, not an activity."""

    code = "not_an_activity"


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
    """Every message of an activity FIT file, as ``{"<name>_mesgs": [{field: value}]}``.

    Why fitdecode and not Garmin's own SDK: on the same fit-tool-written files both read normal
    headers, developer fields and several sessions alike, but garmin-fit-sdk refuses every
    compressed-timestamp record ("not currently supported"), a header form the protocol defines and
    older devices write; fitdecode reads all four (docs/DESIGN.md, "Garmin: the FIT decoder"). Its
    values are the profile's: scaled, named enums, components expanded (``enhanced_speed``),
    ``date_time`` fields as aware UTC datetimes. Developer fields are left out (a Connect IQ field
    may reuse a native name such as ``power``) and so are invalid (None) values, so the mapping
    reads what the device measured and nothing else.
    """
    messages: dict[str, list[dict[str, Any]]] = {}
    try:
        with fitdecode.FitReader(io.BytesIO(data), check_crc=fitdecode.CrcCheck.RAISE,
                                 error_handling=fitdecode.ErrorHandling.RAISE, keep_raw_chunks=False) as reader:
            for frame in reader:
                if isinstance(frame, fitdecode.FitHeader) and frame.proto_ver[0] > SUPPORTED_PROTOCOL_MAJOR:
                    major, minor = frame.proto_ver
                    raise UnsupportedFitFeature(f"FIT protocol version {major}.{minor} (this decoder reads "
                                                f"{SUPPORTED_PROTOCOL_MAJOR}.x)")
                if isinstance(frame, fitdecode.FitDataMessage):
                    messages.setdefault(f"{frame.name}_mesgs", []).append(_fields(frame))
    except FitHeaderError as exc:
        raise CorruptFit(f"broken FIT header: {_words(exc)}") from None
    except FitCRCError:
        raise CorruptFit("FIT CRC mismatch (the file is damaged)") from None
    except FitEOFError:
        raise CorruptFit("FIT file shorter than its header's data size (truncated)") from None
    except FitParseError as exc:
        raise MalformedFit(f"FIT records break the protocol: {_words(exc)}") from None
    except FitError as exc:
        raise UnsupportedFitFeature(f"FIT content the decoder does not read: {_words(exc)}") from None
    except (ValueError, KeyError, IndexError, TypeError, struct.error, NotImplementedError) as exc:
        raise UnsupportedFitFeature(f"FIT content the decoder does not read: {type(exc).__name__}") from None
    if not messages:
        raise CorruptFit("not a FIT file (no header)")
    if not messages.get("session_mesgs"):
        raise NotAnActivity("the FIT file holds no session (a course, workout or monitoring file)")
    return messages


def _fields(frame: fitdecode.FitDataMessage) -> dict[str, Any]:
    """A message's values by name; a sub-field (``avg_running_cadence``) also under its field's name."""
    fields: dict[str, Any] = {}
    for field in frame.fields:
        if field.value is None or isinstance(field.field, DevField):
            continue
        fields[field.name] = field.value
        if isinstance(field.field, SubField) and field.parent_field is not None:
            fields.setdefault(field.parent_field.name, field.value)
    return fields


def _words(exc: Exception) -> str:
    return str(exc)[:MAX_REASON_CHARS]
