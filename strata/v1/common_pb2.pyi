from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class Tier(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TIER_UNSPECIFIED: _ClassVar[Tier]
    TIER_LEVEL_0: _ClassVar[Tier]
    TIER_LEVEL_1: _ClassVar[Tier]
    TIER_LEVEL_2: _ClassVar[Tier]

class Decision(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DECISION_UNSPECIFIED: _ClassVar[Decision]
    DECISION_SKIP: _ClassVar[Decision]
    DECISION_LEVEL_1: _ClassVar[Decision]
    DECISION_LEVEL_2: _ClassVar[Decision]

class Scorer(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SCORER_UNSPECIFIED: _ClassVar[Scorer]
    SCORER_LIGHT: _ClassVar[Scorer]
    SCORER_STRONG: _ClassVar[Scorer]
    SCORER_HUMAN: _ClassVar[Scorer]
    SCORER_REUSED: _ClassVar[Scorer]
TIER_UNSPECIFIED: Tier
TIER_LEVEL_0: Tier
TIER_LEVEL_1: Tier
TIER_LEVEL_2: Tier
DECISION_UNSPECIFIED: Decision
DECISION_SKIP: Decision
DECISION_LEVEL_1: Decision
DECISION_LEVEL_2: Decision
SCORER_UNSPECIFIED: Scorer
SCORER_LIGHT: Scorer
SCORER_STRONG: Scorer
SCORER_HUMAN: Scorer
SCORER_REUSED: Scorer

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_p", "max_new_tokens", "seed", "rollout_dropout")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_DROPOUT_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    max_new_tokens: int
    seed: int
    rollout_dropout: float
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., max_new_tokens: _Optional[int] = ..., seed: _Optional[int] = ..., rollout_dropout: _Optional[float] = ...) -> None: ...

class Direction(_message.Message):
    __slots__ = ("name", "score")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    name: str
    score: float
    def __init__(self, name: _Optional[str] = ..., score: _Optional[float] = ...) -> None: ...
