from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class EncodedPolyline(_message.Message):
    __slots__ = ("encoded", "precision")
    ENCODED_FIELD_NUMBER: _ClassVar[int]
    PRECISION_FIELD_NUMBER: _ClassVar[int]
    encoded: str
    precision: int
    def __init__(self, encoded: _Optional[str] = ..., precision: _Optional[int] = ...) -> None: ...
