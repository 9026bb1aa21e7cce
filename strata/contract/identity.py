"""The identity of a request and of a sample, as every service spells it in its Redis keys."""

from __future__ import annotations


def request_identity(request_id: str, routed_at_seconds: int, routed_at_nanos: int) -> str:
    """A routed request: its id, else (an older client sent none) the time it was routed."""
    return request_id or f"t{routed_at_seconds}.{routed_at_nanos}"


def sample_identity(prompt_hash: str, response_hash: str, request_id: str, sample_index: int) -> str:
    """One sample of one request, whatever Kafka offset it arrives at."""
    return f"{prompt_hash}:{response_hash}:{request_id}:{sample_index}"
