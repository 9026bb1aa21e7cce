from strata.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ScoreItem(_message.Message):
    __slots__ = ("prompt", "response")
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    prompt: str
    response: str
    def __init__(self, prompt: _Optional[str] = ..., response: _Optional[str] = ...) -> None: ...

class ScoreRequest(_message.Message):
    __slots__ = ("items", "scorer")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    SCORER_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[ScoreItem]
    scorer: _common_pb2.Scorer
    def __init__(self, items: _Optional[_Iterable[_Union[ScoreItem, _Mapping]]] = ..., scorer: _Optional[_Union[_common_pb2.Scorer, str]] = ...) -> None: ...

class ItemScore(_message.Message):
    __slots__ = ("reward", "reward_std")
    REWARD_FIELD_NUMBER: _ClassVar[int]
    REWARD_STD_FIELD_NUMBER: _ClassVar[int]
    reward: float
    reward_std: float
    def __init__(self, reward: _Optional[float] = ..., reward_std: _Optional[float] = ...) -> None: ...

class ScoreResponse(_message.Message):
    __slots__ = ("scores", "rm_version", "scorer")
    SCORES_FIELD_NUMBER: _ClassVar[int]
    RM_VERSION_FIELD_NUMBER: _ClassVar[int]
    SCORER_FIELD_NUMBER: _ClassVar[int]
    scores: _containers.RepeatedCompositeFieldContainer[ItemScore]
    rm_version: str
    scorer: _common_pb2.Scorer
    def __init__(self, scores: _Optional[_Iterable[_Union[ItemScore, _Mapping]]] = ..., rm_version: _Optional[str] = ..., scorer: _Optional[_Union[_common_pb2.Scorer, str]] = ...) -> None: ...
