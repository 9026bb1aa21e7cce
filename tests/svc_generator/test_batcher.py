"""The dynamic batcher's engine loop, with a recording backend (no model needed)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest

from strata.sampling import Sampling
from svc_generator.backends.base import GenerationOutput, GenerationRequest
from svc_generator.batcher import DynamicBatcher


class RecordingBackend:
    model_id = "recording"
    tokenizer_id = "recording"

    def __init__(self, fail_on: str | None = None) -> None:
        self.batches: list[list[str]] = []
        self.loaded: list[str] = []
        self.released = 0
        self._fail_on = fail_on

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationOutput]:
        prompts = [r.prompt for r in requests]
        self.batches.append(prompts)
        if self._fail_on in prompts:
            raise RuntimeError("backend exploded")
        # Token count = prompt length, so device-time shares are predictable.
        return [GenerationOutput(p.upper(), tuple(range(len(p))), 3, True) for p in prompts]

    def load_weights(self, path: str) -> None:
        self.loaded.append(path)
        self.model_id = path

    def release_memory(self) -> None:
        self.released += 1


def req(prompt: str) -> GenerationRequest:
    return GenerationRequest(prompt, (), Sampling())


def test_requests_waiting_together_form_one_batch_up_to_the_limit() -> None:
    backend = RecordingBackend()
    batcher = DynamicBatcher(backend, max_batch_size=4, max_wait_s=0.0)
    futures = batcher.submit([req(f"p{i}") for i in range(6)])
    assert batcher.step() == 4
    assert batcher.step() == 2
    assert backend.batches == [["p0", "p1", "p2", "p3"], ["p4", "p5"]]
    assert [f.result(timeout=1).output.text for f in futures] == [f"P{i}" for i in range(6)]
    assert backend.released == 2  # memory given back after every batch


def test_first_request_waits_for_company_until_max_wait() -> None:
    backend = RecordingBackend()
    batcher = DynamicBatcher(backend, max_batch_size=8, max_wait_s=5.0)
    first = batcher.submit([req("early")])
    arrived = threading.Event()

    def late_arrival() -> None:
        batcher.submit([req("late")])
        arrived.set()

    # The step blocks collecting until the batch is full or 5 s passed; a second request arriving
    # meanwhile joins the same batch.
    timer = threading.Timer(0.05, late_arrival)
    timer.start()
    batcher_done = threading.Event()
    sizes: list[int] = []

    def run_step() -> None:
        sizes.append(batcher.step())
        batcher_done.set()

    stepper = threading.Thread(target=run_step)
    stepper.start()
    assert arrived.wait(5)
    batcher.submit([req(f"fill{i}") for i in range(6)])  # fills the batch: the step returns at once
    assert batcher_done.wait(5)
    stepper.join()
    assert sizes == [8]
    assert backend.batches[0][:2] == ["early", "late"]
    assert first[0].result(timeout=1).batch_size == 8


def test_device_time_is_shared_by_tokens() -> None:
    backend = RecordingBackend()
    batcher = DynamicBatcher(backend, max_batch_size=8, max_wait_s=0.0)
    short, long = batcher.submit([req("ab"), req("abcdef")])
    batcher.step()
    a, b = short.result(1), long.result(1)
    assert b.device_seconds == pytest.approx(3 * a.device_seconds)


def test_weights_swap_between_batches_and_versions_are_stamped() -> None:
    backend = RecordingBackend()
    batcher = DynamicBatcher(backend, max_batch_size=8, max_wait_s=0.0, policy_version=0)
    before = batcher.submit([req("x")])
    batcher.step()
    batcher.request_weights("/ckpt/v2", 2)
    batcher.request_weights("/ckpt/v1", 1)  # older than the pending one: ignored
    after = batcher.submit([req("y")])
    batcher.step()
    assert before[0].result(1).policy_version == 0
    assert after[0].result(1).policy_version == 2
    assert after[0].result(1).model_id == "/ckpt/v2"
    assert backend.loaded == ["/ckpt/v2"]


def test_one_bad_request_fails_alone_and_its_batch_mates_are_served() -> None:
    backend = RecordingBackend(fail_on="bad")
    batcher = DynamicBatcher(backend, max_batch_size=8, max_wait_s=0.0)
    futures = batcher.submit([req(p) for p in ("a", "b", "c", "bad", "e")])
    assert batcher.step() == 5
    with pytest.raises(RuntimeError, match="backend exploded"):
        futures[3].result(1)
    assert [futures[i].result(1).output.text for i in (0, 1, 2, 4)] == ["A", "B", "C", "E"]
    # Halves: [a b] served, [c bad e] fails, then [c] served and [bad e] fails, then [bad] alone and [e].
    assert backend.batches[1:] == [["a", "b"], ["c", "bad", "e"], ["c"], ["bad", "e"], ["bad"], ["e"]]
    later = batcher.submit([req("fine")])
    batcher.step()
    assert later[0].result(1).output.text == "FINE"


def test_run_fails_waiting_requests_on_shutdown() -> None:
    batcher = DynamicBatcher(RecordingBackend(), max_batch_size=8, max_wait_s=0.0)
    stop = threading.Event()
    stop.set()
    pending = batcher.submit([req("never")])
    batcher.run(stop)
    with pytest.raises(RuntimeError, match="shutting down"):
        pending[0].result(1)


def test_a_new_lineage_loads_its_first_version_even_if_lower() -> None:
    backend = RecordingBackend()
    batcher = DynamicBatcher(backend, max_batch_size=8, max_wait_s=0.0)
    batcher.request_weights("/run-a/v7", 7)
    batcher.step(poll_timeout_s=0)
    batcher.request_weights("/run-a/v3", 3)  # same lineage, older: ignored
    batcher.reset_version_floor()
    batcher.request_weights("/run-b/v1", 1)
    batcher.step(poll_timeout_s=0)
    assert backend.loaded == ["/run-a/v7", "/run-b/v1"]
    assert batcher.policy_version == 1
