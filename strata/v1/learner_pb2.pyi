from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class LearnerStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LearnerStatus(_message.Message):
    __slots__ = ("policy_version", "step", "checkpoint_path", "metrics", "samples_accepted", "samples_dropped_stale")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_PATH_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_DROPPED_STALE_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    step: int
    checkpoint_path: str
    metrics: _containers.ScalarMap[str, float]
    samples_accepted: int
    samples_dropped_stale: int
    def __init__(self, policy_version: _Optional[int] = ..., step: _Optional[int] = ..., checkpoint_path: _Optional[str] = ..., metrics: _Optional[_Mapping[str, float]] = ..., samples_accepted: _Optional[int] = ..., samples_dropped_stale: _Optional[int] = ...) -> None: ...

class CheckpointRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CheckpointResponse(_message.Message):
    __slots__ = ("policy_version", "checkpoint_path", "checksum")
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_PATH_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    checkpoint_path: str
    checksum: str
    def __init__(self, policy_version: _Optional[int] = ..., checkpoint_path: _Optional[str] = ..., checksum: _Optional[str] = ...) -> None: ...
