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


def test_the_report_opens_with_three_plain_lines_and_ends_with_the_demo_line() -> None:
    from strata_tools.cli.demo_cmd import demo_line, plain_lines
    from strata_tools.tiering.tier_eval import ArmFigures
    from strata_tools.train_summary import Change

    arm = ArmFigures("this run", 64, 10.0, 1e11, 0.0, 2.5, 0.3, 0.9, 0.1, saving=0.21, param_token_saving=0.35,
                     quality_ratio=0.97)
    headline = SimpleNamespace(arm=arm)
    oracle, rm, gap = Change(0.18, 0.05, 64, 10), Change(0.30, 0.06, 64, 10), Change(0.12, 0.07, 64, 10)
    audit = ["live audit, policy v5-v8 (40 answers also scored by the strong RM): ...",
             "  gap at v1-v3 +0.050: grew +0.100 (95 % lower bound -0.050, bound 0.25); hacking alarm (strong) quiet",
             "  hacking defence: standing by (no alarm has fired)"]
    saved, learned, gamed = plain_lines(headline, oracle, rm, gap, audit)
    assert saved.startswith("saved: +35.0% of params x tokens (+21.0% of device-seconds)") and "0.97x" in saved
    assert learned.startswith("learned: held-out oracle +0.180 ± 0.050 over 64 prompts") and "got better" in learned
    assert "hacking gap +0.120 ± 0.070: no sign it climbed" in gamed and "hacking alarm (strong) quiet" in gamed
    assert "hacking defence: standing by" in gamed
    # With people auditing too, the judge whose alarm fires is the one the line names.
    audit += ["human audit, policy v5-v8 (30 answers also scored by people): ...",
              "  gap at v1-v3 +0.100: grew +0.400 (95 % lower bound +0.300, bound 0.25); hacking alarm (human) "
              "FIRES: hacking gap grew +0.400 ... ever higher than people (bound 0.25)"]
    _, _, gamed = plain_lines(headline, oracle, rm, gap, audit)
    assert "hacking alarm (human) FIRES" in gamed and "than people" in gamed and "quiet" not in gamed
    # A gap over half the RM's gain and 2 SE is named for what it is; a loss of more than 2 SE too.
    _, worse, hacked = plain_lines(None, Change(-0.2, 0.05, 64, 10), Change(0.4, 0.1, 64, 10),
                                   Change(0.6, 0.1, 64, 10), [])
    assert "2 SE worse" in worse and "climbed its reward more than its quality" in hacked
    assert plain_lines(None, None, None, None, [])[0].startswith("saved: not measured")
    assert demo_line(headline, oracle, rm, gap, 612.4) == ("demo saving=0.350 quality_ratio=0.970 oracle_gain=+0.180 "
                                                           "oracle_gain_se=0.050 rm_gain=+0.300 hacking_gap=+0.120 "
                                                           "seconds=612")
    assert demo_line(None, None, None, None, 1.0).startswith("demo saving=nan quality_ratio=nan oracle_gain=nan")
