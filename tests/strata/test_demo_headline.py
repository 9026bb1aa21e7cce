"""Which of the demo's own requests its headline measures against the all-Level-2 baseline."""

from __future__ import annotations

from types import SimpleNamespace

from strata.v1 import common_pb2, events_pb2
from strata_tools.cli.demo_cmd import headline_sample
from strata_tools.train import Request

L1 = common_pb2.TIER_LEVEL_1


def _request(i: int, prompt: str, decision: str = "DECISION_LEVEL_1", samples: int = 2) -> Request:
    if decision == "DECISION_SKIP":
        events = [events_pb2.RewardScored(tier=L1, final=True, scorer=common_pb2.SCORER_REUSED)]
    else:
        events = [events_pb2.RewardScored(tier=L1, final=True) for _ in range(samples)]
    return Request(SimpleNamespace(text=prompt, risk=False), f"r-{i}", f"hash-{prompt}", decision, events)


def test_the_headline_takes_completed_requests_once_per_prompt() -> None:
    requests = [_request(0, "a"), _request(1, "a"), _request(2, "b", "DECISION_SKIP"), _request(3, "c", samples=1),
                Request(SimpleNamespace(text="d", risk=False), "", decision="refused"), _request(5, "e")]
    chosen = headline_sample(requests, 10, n_samples=2, seed=0)
    # "c" lacks a sample (the round timed out on it) and "d" was refused; "a" is kept once.
    assert sorted(r.prompt_hash for r in chosen) == ["hash-a", "hash-b", "hash-e"]
    assert len(headline_sample(requests, 2, n_samples=2, seed=0)) == 2
    assert [r.request_id for r in headline_sample(requests, 2, 2, seed=4)] == \
        [r.request_id for r in headline_sample(requests, 2, 2, seed=4)]
    assert headline_sample([], 5, 2, 0) == []
