"""Input checks name the offending field; the lenient parser finds which string was not UTF-8."""

from __future__ import annotations

import pytest

from strata.sampling import SamplingRequest as Sampling
from strata.v1 import scheduler_pb2
from strata.validation import RequestError, validate_submit
from svc_scheduler.config import SchedulerSettings
from svc_scheduler.servicer import Malformed, _varint, lenient

SETTINGS = SchedulerSettings(max_prompt_chars=50, max_prompt_bytes=60, max_n_samples=8)


def validate(prompt: str, sampling: Sampling, n_samples: int, request_id: str, settings: SchedulerSettings):
    return validate_submit(prompt, sampling, n_samples, request_id, settings.submit_limits())


@pytest.mark.parametrize(
    ("prompt", "sampling", "n_samples", "field", "words"),
    [
        ("", Sampling(), 1, "prompt", "must not be empty"),
        ("   \n", Sampling(), 1, "prompt", "must not be empty"),
        ("x" * 51, Sampling(), 1, "prompt", "51 characters"),
        ("é" * 31, Sampling(), 1, "prompt", "62 bytes"),
        ("hello\x00world", Sampling(), 1, "prompt", "U+0000"),
        ("ansi \x1b[31m red", Sampling(), 1, "prompt", "U+001B"),
        ("lone \ud800 surrogate", Sampling(), 1, "prompt", "not valid Unicode"),
        ("ok", Sampling(temperature=0.3), 1, "sampling.temperature", "> 0.3"),
        ("ok", Sampling(temperature=float("nan")), 1, "sampling.temperature", "finite"),
        ("ok", Sampling(temperature=5.0), 1, "sampling.temperature", "<= 2"),
        ("ok", Sampling(top_p=0.95), 1, "sampling.top_p", "< 0.95"),
        ("ok", Sampling(top_p=0.0), 1, "sampling.top_p", "(0, 1]"),
        ("ok", Sampling(max_new_tokens=0), 1, "sampling.max_new_tokens", "[1, 512]"),
        ("ok", Sampling(rollout_dropout=1.0), 1, "sampling.rollout_dropout", "[0, 1)"),
        ("ok", Sampling(), 9, "n_samples", "[0, 8]"),
    ],
)
def test_bad_input_names_the_field(prompt, sampling, n_samples, field, words) -> None:
    with pytest.raises(RequestError) as caught:
        validate(prompt, sampling, n_samples, "", SETTINGS)
    assert caught.value.field == field
    assert str(caught.value).startswith(f"{field}: ")
    assert words in caught.value.problem


def test_good_input_passes_and_zero_samples_means_the_default() -> None:
    request = validate("Tabs\tand\nnewlines are text.", Sampling(temperature=0.7, top_p=0.9), 0, "r1", SETTINGS)
    assert request.n_samples == SETTINGS.default_n_samples
    assert validate("ok", Sampling(), 8, "", SETTINGS).n_samples == 8


def test_request_id_bounds() -> None:
    with pytest.raises(RequestError, match="request_id"):
        validate("ok", Sampling(), 1, "x" * 129, SETTINGS)


def test_lenient_parser_finds_the_non_utf8_field() -> None:
    good = scheduler_pb2.SubmitRequest(prompt="hi", request_id="r").SerializeToString()
    assert lenient(scheduler_pb2.SubmitRequest)(good).prompt == "hi"
    bad_prompt = b"\x0a\x03\xff\xfeA"  # field 1 (prompt), 3 bytes, not UTF-8
    assert lenient(scheduler_pb2.SubmitRequest)(bad_prompt) == Malformed("prompt", bad_prompt_problem())
    bad_id = b"\x0a\x02hi" + b"\x22\x01\xc3"  # field 4 (request_id), truncated UTF-8 sequence
    assert lenient(scheduler_pb2.SubmitRequest)(bad_id).field == "request_id"
    batch = b"\x0a\x04" + b"\x0a\x02ok" + b"\x0a\x03" + b"\x0a\x01\xff"  # requests[1].prompt is bad
    assert lenient(scheduler_pb2.SubmitBatchRequest)(batch).field == "requests[1].prompt"
    assert lenient(scheduler_pb2.SubmitRequest)(b"\x0a\x09ab").field == "request"  # truncated: malformed


def bad_prompt_problem() -> str:
    return "is not valid UTF-8 (binary data is not a prompt)"


def test_garbage_is_refused_without_reading_past_a_varints_ten_bytes() -> None:
    # A run of continuation bytes is not protobuf: the scan gives up after 10 bytes instead of
    # building an ever larger int (which made 400 KB of garbage take seconds to refuse).
    with pytest.raises(IndexError, match="longer than 10 bytes"):
        _varint(b"\xff" * 400_000, 0)
    assert _varint(b"\xac\x02", 0) == (300, 2)
    garbage = b"\x0a" + b"\xff" * 400_000
    assert lenient(scheduler_pb2.SubmitRequest)(garbage) == Malformed("request", "is not a valid SubmitRequest")


def test_a_full_batch_of_the_longest_prompts_fits_the_message_limit() -> None:
    settings = SchedulerSettings()
    longest = "😀" * (settings.max_prompt_bytes // 4)  # 4 bytes each in UTF-8
    batch = scheduler_pb2.SubmitBatchRequest(requests=[
        scheduler_pb2.SubmitRequest(prompt=longest, request_id="r" * settings.max_request_id_chars, n_samples=16,
                                    sampling={"temperature": 0.7, "top_p": 0.9, "max_new_tokens": 512,
                                              "seed": 2**62, "rollout_dropout": 0.1})
        for _ in range(settings.max_batch_size)
    ])
    assert batch.ByteSize() <= settings.largest_batch_bytes <= settings.grpc_max_receive_bytes
    with pytest.raises(ValueError, match="grpc_max_receive_bytes"):
        SchedulerSettings(max_batch_size=1000)
