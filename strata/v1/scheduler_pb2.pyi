from strata.v1 import common_pb2 as _common_pb2
from strata.v1 import events_pb2 as _events_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SubmitRequest(_message.Message):
    __slots__ = ("prompt", "sampling", "n_samples", "request_id")
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    N_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    prompt: str
    sampling: _common_pb2.SamplingParams
    n_samples: int
    request_id: str
    def __init__(self, prompt: _Optional[str] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., n_samples: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class SubmitResponse(_message.Message):
    __slots__ = ("prompt_hash", "decision", "tier", "reason", "reused_reward", "neighbours", "low_variance_neighbours", "request_id")
    PROMPT_HASH_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REUSED_REWARD_FIELD_NUMBER: _ClassVar[int]
    NEIGHBOURS_FIELD_NUMBER: _ClassVar[int]
    LOW_VARIANCE_NEIGHBOURS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    prompt_hash: str
    decision: _common_pb2.Decision
    tier: _common_pb2.Tier
    reason: str
    reused_reward: float
    neighbours: int
    low_variance_neighbours: int
    request_id: str
    def __init__(self, prompt_hash: _Optional[str] = ..., decision: _Optional[_Union[_common_pb2.Decision, str]] = ..., tier: _Optional[_Union[_common_pb2.Tier, str]] = ..., reason: _Optional[str] = ..., reused_reward: _Optional[float] = ..., neighbours: _Optional[int] = ..., low_variance_neighbours: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class SubmitBatchRequest(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[SubmitRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[SubmitRequest, _Mapping]]] = ...) -> None: ...

class SubmitBatchResult(_message.Message):
    __slots__ = ("response", "error")
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    response: SubmitResponse
    error: str
    def __init__(self, response: _Optional[_Union[SubmitResponse, _Mapping]] = ..., error: _Optional[str] = ...) -> None: ...

class SubmitBatchResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[SubmitBatchResult]
    def __init__(self, results: _Optional[_Iterable[_Union[SubmitBatchResult, _Mapping]]] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("prompt_hash",)
    PROMPT_HASH_FIELD_NUMBER: _ClassVar[int]
    prompt_hash: str
    def __init__(self, prompt_hash: _Optional[str] = ...) -> None: ...

class WatchEvent(_message.Message):
    __slots__ = ("routed", "rollout", "reward")
    ROUTED_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    routed: _events_pb2.PromptRouted
    rollout: _events_pb2.RolloutGenerated
    reward: _events_pb2.RewardScored
    def __init__(self, routed: _Optional[_Union[_events_pb2.PromptRouted, _Mapping]] = ..., rollout: _Optional[_Union[_events_pb2.RolloutGenerated, _Mapping]] = ..., reward: _Optional[_Union[_events_pb2.RewardScored, _Mapping]] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("decisions", "skip_rate", "index_size", "submitted", "high_uncertainty_marks", "audits", "audits_scored", "audit_reuse_mae", "audit_precision", "audit_tolerance", "audit_reuse_mae_ci95", "audit_distrusts", "audit_similarity_floors")
    class DecisionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    SKIP_RATE_FIELD_NUMBER: _ClassVar[int]
    INDEX_SIZE_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_FIELD_NUMBER: _ClassVar[int]
    HIGH_UNCERTAINTY_MARKS_FIELD_NUMBER: _ClassVar[int]
    AUDITS_FIELD_NUMBER: _ClassVar[int]
    AUDITS_SCORED_FIELD_NUMBER: _ClassVar[int]
    AUDIT_REUSE_MAE_FIELD_NUMBER: _ClassVar[int]
    AUDIT_PRECISION_FIELD_NUMBER: _ClassVar[int]
    AUDIT_TOLERANCE_FIELD_NUMBER: _ClassVar[int]
    AUDIT_REUSE_MAE_CI95_FIELD_NUMBER: _ClassVar[int]
    AUDIT_DISTRUSTS_FIELD_NUMBER: _ClassVar[int]
    AUDIT_SIMILARITY_FLOORS_FIELD_NUMBER: _ClassVar[int]
    decisions: _containers.ScalarMap[str, int]
    skip_rate: float
    index_size: int
    submitted: int
    high_uncertainty_marks: int
    audits: int
    audits_scored: int
    audit_reuse_mae: float
    audit_precision: float
    audit_tolerance: float
    audit_reuse_mae_ci95: float
    audit_distrusts: int
    audit_similarity_floors: int
    def __init__(self, decisions: _Optional[_Mapping[str, int]] = ..., skip_rate: _Optional[float] = ..., index_size: _Optional[int] = ..., submitted: _Optional[int] = ..., high_uncertainty_marks: _Optional[int] = ..., audits: _Optional[int] = ..., audits_scored: _Optional[int] = ..., audit_reuse_mae: _Optional[float] = ..., audit_precision: _Optional[float] = ..., audit_tolerance: _Optional[float] = ..., audit_reuse_mae_ci95: _Optional[float] = ..., audit_distrusts: _Optional[int] = ..., audit_similarity_floors: _Optional[int] = ...) -> None: ...
