from strata.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DirectionsRequest(_message.Message):
    __slots__ = ("prompt", "top_k")
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    prompt: str
    top_k: int
    def __init__(self, prompt: _Optional[str] = ..., top_k: _Optional[int] = ...) -> None: ...

class DirectionsResponse(_message.Message):
    __slots__ = ("prompt_hash", "directions", "caution", "caution_reason", "confidence")
    PROMPT_HASH_FIELD_NUMBER: _ClassVar[int]
    DIRECTIONS_FIELD_NUMBER: _ClassVar[int]
    CAUTION_FIELD_NUMBER: _ClassVar[int]
    CAUTION_REASON_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    prompt_hash: str
    directions: _containers.RepeatedCompositeFieldContainer[_common_pb2.Direction]
    caution: bool
    caution_reason: str
    confidence: float
    def __init__(self, prompt_hash: _Optional[str] = ..., directions: _Optional[_Iterable[_Union[_common_pb2.Direction, _Mapping]]] = ..., caution: _Optional[bool] = ..., caution_reason: _Optional[str] = ..., confidence: _Optional[float] = ...) -> None: ...
