import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NextRequest(_message.Message):
    __slots__ = ("annotator_id",)
    ANNOTATOR_ID_FIELD_NUMBER: _ClassVar[int]
    annotator_id: str
    def __init__(self, annotator_id: _Optional[str] = ...) -> None: ...

class NextResponse(_message.Message):
    __slots__ = ("has_item", "item_id", "prompt", "response", "assigned_until")
    HAS_ITEM_FIELD_NUMBER: _ClassVar[int]
    ITEM_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    ASSIGNED_UNTIL_FIELD_NUMBER: _ClassVar[int]
    has_item: bool
    item_id: str
    prompt: str
    response: str
    assigned_until: _timestamp_pb2.Timestamp
    def __init__(self, has_item: _Optional[bool] = ..., item_id: _Optional[str] = ..., prompt: _Optional[str] = ..., response: _Optional[str] = ..., assigned_until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class AnnotationScoreRequest(_message.Message):
    __slots__ = ("annotator_id", "item_id", "score", "unsafe", "off_topic")
    ANNOTATOR_ID_FIELD_NUMBER: _ClassVar[int]
    ITEM_ID_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    UNSAFE_FIELD_NUMBER: _ClassVar[int]
    OFF_TOPIC_FIELD_NUMBER: _ClassVar[int]
    annotator_id: str
    item_id: str
    score: float
    unsafe: bool
    off_topic: bool
    def __init__(self, annotator_id: _Optional[str] = ..., item_id: _Optional[str] = ..., score: _Optional[float] = ..., unsafe: _Optional[bool] = ..., off_topic: _Optional[bool] = ...) -> None: ...

class AnnotationScoreResponse(_message.Message):
    __slots__ = ("item_id", "scored_by_you")
    ITEM_ID_FIELD_NUMBER: _ClassVar[int]
    SCORED_BY_YOU_FIELD_NUMBER: _ClassVar[int]
    item_id: str
    scored_by_you: int
    def __init__(self, item_id: _Optional[str] = ..., scored_by_you: _Optional[int] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AnnotatorStatus(_message.Message):
    __slots__ = ("scored", "gold_scored", "assignments", "mean_score", "has_open_assignment", "drift_status", "gold_bias", "gold_window", "peer_agreement")
    SCORED_FIELD_NUMBER: _ClassVar[int]
    GOLD_SCORED_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    MEAN_SCORE_FIELD_NUMBER: _ClassVar[int]
    HAS_OPEN_ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    DRIFT_STATUS_FIELD_NUMBER: _ClassVar[int]
    GOLD_BIAS_FIELD_NUMBER: _ClassVar[int]
    GOLD_WINDOW_FIELD_NUMBER: _ClassVar[int]
    PEER_AGREEMENT_FIELD_NUMBER: _ClassVar[int]
    scored: int
    gold_scored: int
    assignments: int
    mean_score: float
    has_open_assignment: bool
    drift_status: str
    gold_bias: float
    gold_window: int
    peer_agreement: float
    def __init__(self, scored: _Optional[int] = ..., gold_scored: _Optional[int] = ..., assignments: _Optional[int] = ..., mean_score: _Optional[float] = ..., has_open_assignment: _Optional[bool] = ..., drift_status: _Optional[str] = ..., gold_bias: _Optional[float] = ..., gold_window: _Optional[int] = ..., peer_agreement: _Optional[float] = ...) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("queue_depth", "assigned", "enqueued", "completed", "expired", "gold_items", "annotators")
    class AnnotatorsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: AnnotatorStatus
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[AnnotatorStatus, _Mapping]] = ...) -> None: ...
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    ASSIGNED_FIELD_NUMBER: _ClassVar[int]
    ENQUEUED_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    EXPIRED_FIELD_NUMBER: _ClassVar[int]
    GOLD_ITEMS_FIELD_NUMBER: _ClassVar[int]
    ANNOTATORS_FIELD_NUMBER: _ClassVar[int]
    queue_depth: int
    assigned: int
    enqueued: int
    completed: int
    expired: int
    gold_items: int
    annotators: _containers.MessageMap[str, AnnotatorStatus]
    def __init__(self, queue_depth: _Optional[int] = ..., assigned: _Optional[int] = ..., enqueued: _Optional[int] = ..., completed: _Optional[int] = ..., expired: _Optional[int] = ..., gold_items: _Optional[int] = ..., annotators: _Optional[_Mapping[str, AnnotatorStatus]] = ...) -> None: ...
