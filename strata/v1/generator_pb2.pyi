from strata.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GenerateRequest(_message.Message):
    __slots__ = ("prompt", "sampling", "n_samples", "directions")
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    N_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    DIRECTIONS_FIELD_NUMBER: _ClassVar[int]
    prompt: str
    sampling: _common_pb2.SamplingParams
    n_samples: int
    directions: _containers.RepeatedCompositeFieldContainer[_common_pb2.Direction]
    def __init__(self, prompt: _Optional[str] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., n_samples: _Optional[int] = ..., directions: _Optional[_Iterable[_Union[_common_pb2.Direction, _Mapping]]] = ...) -> None: ...

class Generation(_message.Message):
    __slots__ = ("response", "response_hash", "response_tokens", "sample_index")
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_HASH_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    response: str
    response_hash: str
    response_tokens: int
    sample_index: int
    def __init__(self, response: _Optional[str] = ..., response_hash: _Optional[str] = ..., response_tokens: _Optional[int] = ..., sample_index: _Optional[int] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("prompt_hash", "tier", "model_id", "policy_version", "generations", "sampling", "device_seconds")
    PROMPT_HASH_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    GENERATIONS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    DEVICE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    prompt_hash: str
    tier: _common_pb2.Tier
    model_id: str
    policy_version: int
    generations: _containers.RepeatedCompositeFieldContainer[Generation]
    sampling: _common_pb2.SamplingParams
    device_seconds: float
    def __init__(self, prompt_hash: _Optional[str] = ..., tier: _Optional[_Union[_common_pb2.Tier, str]] = ..., model_id: _Optional[str] = ..., policy_version: _Optional[int] = ..., generations: _Optional[_Iterable[_Union[Generation, _Mapping]]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., device_seconds: _Optional[float] = ...) -> None: ...

class GenerateChunk(_message.Message):
    __slots__ = ("sample_index", "text_delta", "finished", "generation", "policy_version")
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    TEXT_DELTA_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    sample_index: int
    text_delta: str
    finished: bool
    generation: Generation
    policy_version: int
    def __init__(self, sample_index: _Optional[int] = ..., text_delta: _Optional[str] = ..., finished: _Optional[bool] = ..., generation: _Optional[_Union[Generation, _Mapping]] = ..., policy_version: _Optional[int] = ...) -> None: ...
