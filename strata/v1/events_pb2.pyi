import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from strata.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PromptRouted(_message.Message):
    __slots__ = ("prompt_hash", "tier", "decision", "reason", "sampling", "n_samples", "directions", "caution", "escalated_from", "policy_version", "request_id", "submitted_at", "routed_at", "level1_only", "level1_record")
    PROMPT_HASH_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    N_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    DIRECTIONS_FIELD_NUMBER: _ClassVar[int]
    CAUTION_FIELD_NUMBER: _ClassVar[int]
    ESCALATED_FROM_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_AT_FIELD_NUMBER: _ClassVar[int]
    ROUTED_AT_FIELD_NUMBER: _ClassVar[int]
    LEVEL1_ONLY_FIELD_NUMBER: _ClassVar[int]
    LEVEL1_RECORD_FIELD_NUMBER: _ClassVar[int]
    prompt_hash: str
    tier: _common_pb2.Tier
    decision: _common_pb2.Decision
    reason: str
    sampling: _common_pb2.SamplingParams
    n_samples: int
    directions: _containers.RepeatedCompositeFieldContainer[_common_pb2.Direction]
    caution: bool
    escalated_from: _common_pb2.Tier
    policy_version: int
    request_id: str
    submitted_at: _timestamp_pb2.Timestamp
    routed_at: _timestamp_pb2.Timestamp
    level1_only: bool
    level1_record: Level1Record
    def __init__(self, prompt_hash: _Optional[str] = ..., tier: _Optional[_Union[_common_pb2.Tier, str]] = ..., decision: _Optional[_Union[_common_pb2.Decision, str]] = ..., reason: _Optional[str] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., n_samples: _Optional[int] = ..., directions: _Optional[_Iterable[_Union[_common_pb2.Direction, _Mapping]]] = ..., caution: _Optional[bool] = ..., escalated_from: _Optional[_Union[_common_pb2.Tier, str]] = ..., policy_version: _Optional[int] = ..., request_id: _Optional[str] = ..., submitted_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., routed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., level1_only: _Optional[bool] = ..., level1_record: _Optional[_Union[Level1Record, _Mapping]] = ...) -> None: ...

class Level1Record(_message.Message):
    __slots__ = ("labelled", "bad")
    LABELLED_FIELD_NUMBER: _ClassVar[int]
    BAD_FIELD_NUMBER: _ClassVar[int]
    labelled: float
    bad: float
    def __init__(self, labelled: _Optional[float] = ..., bad: _Optional[float] = ...) -> None: ...

class RolloutGenerated(_message.Message):
    __slots__ = ("prompt_hash", "response_hash", "tier", "policy_version", "model_id", "sample_index", "prompt_tokens", "response_tokens", "device_seconds", "sampling", "directions", "caution", "escalated_from", "request_id", "routed_at", "generated_at", "response_logprob_mean", "response_logprob_min", "level1_record")
    PROMPT_HASH_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_HASH_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    DIRECTIONS_FIELD_NUMBER: _ClassVar[int]
    CAUTION_FIELD_NUMBER: _ClassVar[int]
    ESCALATED_FROM_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ROUTED_AT_FIELD_NUMBER: _ClassVar[int]
    GENERATED_AT_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_LOGPROB_MEAN_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_LOGPROB_MIN_FIELD_NUMBER: _ClassVar[int]
    LEVEL1_RECORD_FIELD_NUMBER: _ClassVar[int]
    prompt_hash: str
    response_hash: str
    tier: _common_pb2.Tier
    policy_version: int
    model_id: str
    sample_index: int
    prompt_tokens: int
    response_tokens: int
    device_seconds: float
    sampling: _common_pb2.SamplingParams
    directions: _containers.RepeatedCompositeFieldContainer[_common_pb2.Direction]
    caution: bool
    escalated_from: _common_pb2.Tier
    request_id: str
    routed_at: _timestamp_pb2.Timestamp
    generated_at: _timestamp_pb2.Timestamp
    response_logprob_mean: float
    response_logprob_min: float
    level1_record: Level1Record
    def __init__(self, prompt_hash: _Optional[str] = ..., response_hash: _Optional[str] = ..., tier: _Optional[_Union[_common_pb2.Tier, str]] = ..., policy_version: _Optional[int] = ..., model_id: _Optional[str] = ..., sample_index: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., response_tokens: _Optional[int] = ..., device_seconds: _Optional[float] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., directions: _Optional[_Iterable[_Union[_common_pb2.Direction, _Mapping]]] = ..., caution: _Optional[bool] = ..., escalated_from: _Optional[_Union[_common_pb2.Tier, str]] = ..., request_id: _Optional[str] = ..., routed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., generated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., response_logprob_mean: _Optional[float] = ..., response_logprob_min: _Optional[float] = ..., level1_record: _Optional[_Union[Level1Record, _Mapping]] = ...) -> None: ...

class RewardScored(_message.Message):
    __slots__ = ("prompt_hash", "response_hash", "tier", "policy_version", "rm_version", "reward", "reward_std", "scorer", "final", "escalated", "unsafe", "sample_index", "response_tokens", "request_id", "generated_at", "scored_at", "directions", "annotator_id", "awaiting_annotation")
    PROMPT_HASH_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_HASH_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    RM_VERSION_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    REWARD_STD_FIELD_NUMBER: _ClassVar[int]
    SCORER_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    ESCALATED_FIELD_NUMBER: _ClassVar[int]
    UNSAFE_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATED_AT_FIELD_NUMBER: _ClassVar[int]
    SCORED_AT_FIELD_NUMBER: _ClassVar[int]
    DIRECTIONS_FIELD_NUMBER: _ClassVar[int]
    ANNOTATOR_ID_FIELD_NUMBER: _ClassVar[int]
    AWAITING_ANNOTATION_FIELD_NUMBER: _ClassVar[int]
    prompt_hash: str
    response_hash: str
    tier: _common_pb2.Tier
    policy_version: int
    rm_version: str
    reward: float
    reward_std: float
    scorer: _common_pb2.Scorer
    final: bool
    escalated: bool
    unsafe: bool
    sample_index: int
    response_tokens: int
    request_id: str
    generated_at: _timestamp_pb2.Timestamp
    scored_at: _timestamp_pb2.Timestamp
    directions: _containers.RepeatedCompositeFieldContainer[_common_pb2.Direction]
    annotator_id: str
    awaiting_annotation: bool
    def __init__(self, prompt_hash: _Optional[str] = ..., response_hash: _Optional[str] = ..., tier: _Optional[_Union[_common_pb2.Tier, str]] = ..., policy_version: _Optional[int] = ..., rm_version: _Optional[str] = ..., reward: _Optional[float] = ..., reward_std: _Optional[float] = ..., scorer: _Optional[_Union[_common_pb2.Scorer, str]] = ..., final: _Optional[bool] = ..., escalated: _Optional[bool] = ..., unsafe: _Optional[bool] = ..., sample_index: _Optional[int] = ..., response_tokens: _Optional[int] = ..., request_id: _Optional[str] = ..., generated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., scored_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., directions: _Optional[_Iterable[_Union[_common_pb2.Direction, _Mapping]]] = ..., annotator_id: _Optional[str] = ..., awaiting_annotation: _Optional[bool] = ...) -> None: ...

class PolicyUpdated(_message.Message):
    __slots__ = ("policy_version", "step", "checkpoint_path", "checksum", "metrics", "published_at", "lineage")
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
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_AT_FIELD_NUMBER: _ClassVar[int]
    LINEAGE_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    step: int
    checkpoint_path: str
    checksum: str
    metrics: _containers.ScalarMap[str, float]
    published_at: _timestamp_pb2.Timestamp
    lineage: str
    def __init__(self, policy_version: _Optional[int] = ..., step: _Optional[int] = ..., checkpoint_path: _Optional[str] = ..., checksum: _Optional[str] = ..., metrics: _Optional[_Mapping[str, float]] = ..., published_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., lineage: _Optional[str] = ...) -> None: ...

class RewardModelUpdated(_message.Message):
    __slots__ = ("rm_version", "path", "ensemble_paths", "checksum", "metrics", "published_at")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    RM_VERSION_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    ENSEMBLE_PATHS_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_AT_FIELD_NUMBER: _ClassVar[int]
    rm_version: str
    path: str
    ensemble_paths: _containers.RepeatedScalarFieldContainer[str]
    checksum: str
    metrics: _containers.ScalarMap[str, float]
    published_at: _timestamp_pb2.Timestamp
    def __init__(self, rm_version: _Optional[str] = ..., path: _Optional[str] = ..., ensemble_paths: _Optional[_Iterable[str]] = ..., checksum: _Optional[str] = ..., metrics: _Optional[_Mapping[str, float]] = ..., published_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class AnnotationRequested(_message.Message):
    __slots__ = ("prompt_hash", "response_hash", "tier", "policy_version", "rm_version", "model_reward", "reason", "requested_at", "provisional")
    PROMPT_HASH_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_HASH_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    RM_VERSION_FIELD_NUMBER: _ClassVar[int]
    MODEL_REWARD_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_AT_FIELD_NUMBER: _ClassVar[int]
    PROVISIONAL_FIELD_NUMBER: _ClassVar[int]
    prompt_hash: str
    response_hash: str
    tier: _common_pb2.Tier
    policy_version: int
    rm_version: str
    model_reward: float
    reason: str
    requested_at: _timestamp_pb2.Timestamp
    provisional: RewardScored
    def __init__(self, prompt_hash: _Optional[str] = ..., response_hash: _Optional[str] = ..., tier: _Optional[_Union[_common_pb2.Tier, str]] = ..., policy_version: _Optional[int] = ..., rm_version: _Optional[str] = ..., model_reward: _Optional[float] = ..., reason: _Optional[str] = ..., requested_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., provisional: _Optional[_Union[RewardScored, _Mapping]] = ...) -> None: ...

class AnnotationCompleted(_message.Message):
    __slots__ = ("prompt_hash", "response_hash", "annotator_id", "score", "unsafe", "policy_version", "rm_version", "requested_at", "completed_at", "off_topic", "gold", "request_id", "sample_index", "tier")
    PROMPT_HASH_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_HASH_FIELD_NUMBER: _ClassVar[int]
    ANNOTATOR_ID_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    UNSAFE_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    RM_VERSION_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_AT_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_AT_FIELD_NUMBER: _ClassVar[int]
    OFF_TOPIC_FIELD_NUMBER: _ClassVar[int]
    GOLD_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    prompt_hash: str
    response_hash: str
    annotator_id: str
    score: float
    unsafe: bool
    policy_version: int
    rm_version: str
    requested_at: _timestamp_pb2.Timestamp
    completed_at: _timestamp_pb2.Timestamp
    off_topic: bool
    gold: bool
    request_id: str
    sample_index: int
    tier: _common_pb2.Tier
    def __init__(self, prompt_hash: _Optional[str] = ..., response_hash: _Optional[str] = ..., annotator_id: _Optional[str] = ..., score: _Optional[float] = ..., unsafe: _Optional[bool] = ..., policy_version: _Optional[int] = ..., rm_version: _Optional[str] = ..., requested_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., completed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., off_topic: _Optional[bool] = ..., gold: _Optional[bool] = ..., request_id: _Optional[str] = ..., sample_index: _Optional[int] = ..., tier: _Optional[_Union[_common_pb2.Tier, str]] = ...) -> None: ...

class RolloutLogRecord(_message.Message):
    __slots__ = ("prompt_hash", "response_hash", "reward")
    PROMPT_HASH_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_HASH_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    prompt_hash: str
    response_hash: str
    reward: float
    def __init__(self, prompt_hash: _Optional[str] = ..., response_hash: _Optional[str] = ..., reward: _Optional[float] = ...) -> None: ...

class PromptIndexed(_message.Message):
    __slots__ = ("prompt_hash", "encoder_id", "indexed_at")
    PROMPT_HASH_FIELD_NUMBER: _ClassVar[int]
    ENCODER_ID_FIELD_NUMBER: _ClassVar[int]
    INDEXED_AT_FIELD_NUMBER: _ClassVar[int]
    prompt_hash: str
    encoder_id: str
    indexed_at: _timestamp_pb2.Timestamp
    def __init__(self, prompt_hash: _Optional[str] = ..., encoder_id: _Optional[str] = ..., indexed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...
