"""The loop's answer to hacking on scripted audit streams (pure): the strong-RM share rises one step per newer
policy version while the alarm fires, a re-distillation is requested once, and the share comes back down
once the gap's growth is under half the bound."""

from __future__ import annotations

import pytest
from auditutil import audit_stream

from strata.audit import HUMAN_AUDIT, STRONG_AUDIT, AuditJudge, estimates, windows
from svc_reward.defence import DefenceState, respond

BOUND, STEP, MAX = 0.25, 0.1, 0.3
BRAKE = {"kl_factor": 2.0, "max_kl_scale": 8.0}


def run(gap_at: list[float], state: DefenceState | None = None, looks_per_version: int = 2, noise: float = 0.3,
        judge: AuditJudge = STRONG_AUDIT, strong_growth: float = float("nan"), steps: list | None = None,
        kl_factor: float = 1.0, max_kl_scale: float = 1.0):
    """The defence after each policy version, looked at ``looks_per_version`` times (replicas, batches)."""
    state = state or DefenceState()
    shares, decisions, requests = [], [], 0
    versions = audit_stream(gap_at, per_version=8, noise=noise)
    for seen in range(1, len(versions) + 1):
        baseline, current = windows(versions[:seen], min_audits=24)
        if current is None:
            shares.append(state.share)
            continue
        for _ in range(looks_per_version):
            step = respond(state, estimates(baseline.tally) if baseline else None, estimates(current.tally),
                           current.last_version, BOUND, STEP, MAX, judge, strong_growth, kl_factor, max_kl_scale)
            if steps is not None and step.decision:
                steps.append(step)
            state = step.state
            requests += step.redistil
            if step.decision:
                decisions.append(step.decision)
        shares.append(state.share)
    return state, shares, decisions, requests


def test_a_steady_offset_is_left_alone() -> None:
    _, shares, decisions, requests = run([0.6] * 20)
    assert set(shares) == {0.0} and decisions == [] and requests == 0


def test_a_growing_gap_raises_the_share_one_step_per_version_up_to_the_cap_and_asks_once() -> None:
    state, shares, decisions, requests = run([0.0] * 6 + [0.1 * v for v in range(1, 15)])
    first = next(i for i, s in enumerate(shares) if s > 0)
    assert shares[first] == pytest.approx(STEP)  # two looks at one version: one step
    assert shares[first:first + 3] == pytest.approx([0.1, 0.2, 0.3]) and max(shares) == pytest.approx(MAX)
    assert requests == 1 and state.redistil_requested
    assert "re-distillation" in decisions[0] and "0.00 -> 0.10" in decisions[0] and "hacking gap grew" in decisions[0]
    assert all("re-distillation" not in d for d in decisions[1:])


def test_the_share_comes_down_once_the_gap_closes_and_a_later_alarm_asks_again() -> None:
    hacked = DefenceState(share=0.3, acted_on=-1, redistil_requested=True)
    state, shares, decisions, requests = run([0.0] * 20, state=hacked)  # the policy's answers back in line
    assert shares[-1] == 0.0 and not state.redistil_requested and requests == 0
    assert [d.split("share of Level-1 answers ")[1] for d in decisions] == ["0.30 -> 0.20", "0.20 -> 0.10",
                                                                            "0.10 -> 0.00"]
    _, _, _, again = run([0.0] * 6 + [0.1 * v for v in range(1, 8)], state=DefenceState(acted_on=-1))
    assert again == 1


def test_quiet_but_not_well_under_the_bound_holds() -> None:
    # From the first comparison on the gap has grown ~0.2: under the bound (no alarm) but over half of it.
    _, shares, decisions, _ = run([0.0] * 3 + [0.2] * 15, state=DefenceState(share=0.2, redistil_requested=True),
                                  noise=0.1)
    assert shares[-1] == pytest.approx(0.2) and decisions == []


def test_the_state_reads_back() -> None:
    state = DefenceState(0.3, 12, True)
    assert DefenceState.from_json(state.to_json()) == state and DefenceState.from_json(None) == DefenceState()


def test_the_description_names_the_share_the_request_and_the_newest_decisions() -> None:
    from svc_reward.defence import describe

    assert "off" in describe(DefenceState(), [], enabled=False, redistil_pending=False)[0]
    assert "standing by" in describe(DefenceState(), [], enabled=True, redistil_pending=False)[0]
    decisions = [{"at": 0.0, "decision": f"policy v{v}: step"} for v in (9, 8, 7, 6)]
    lines = describe(DefenceState(0.3, 9, True), decisions, enabled=True, redistil_pending=True)
    assert "+0.30" in lines[0] and "re-distillation" in lines[0]
    assert [line.split()[-2] for line in lines[1:]] == ["v9:", "v8:", "v7:"]  # the newest three


def test_when_people_decide_and_the_strong_rm_is_blind_the_share_holds_and_people_teach() -> None:
    steps: list = []
    growing = [0.0] * 6 + [0.1 * v for v in range(1, 15)]
    state, shares, decisions, requests = run(growing, judge=HUMAN_AUDIT, strong_growth=0.02, steps=steps)
    assert set(shares) == {0.0}  # a copy's reward would not change what PPO climbs
    assert requests == 1 and state.redistil_requested and len(decisions) == 1
    assert steps[0].labels == "people" and steps[0].redistil
    assert "than people" in decisions[0] and "share holds at 0.00" in decisions[0]
    assert "people's scores of the policy's answers" in decisions[0]

    # The gap back in line: the defence stands down (nothing to lower), so that a later alarm asks again.
    state, shares, decisions, requests = run([0.0] * 20, state=DefenceState(redistil_requested=True),
                                             judge=HUMAN_AUDIT, strong_growth=0.02)
    assert not state.redistil_requested and requests == 0 and len(decisions) == 1 and "stands down" in decisions[0]
    _, _, _, again = run(growing, state=DefenceState(), judge=HUMAN_AUDIT, strong_growth=0.02)
    assert again == 1


def test_when_people_decide_and_the_strong_rm_sees_it_too_its_share_rises_and_people_teach() -> None:
    steps: list = []
    _, shares, _, requests = run([0.0] * 6 + [0.1 * v for v in range(1, 15)], judge=HUMAN_AUDIT,
                                 strong_growth=0.4, steps=steps)
    assert max(shares) == pytest.approx(MAX) and requests == 1 and steps[0].labels == "people"


def test_when_people_decide_before_the_strong_rm_has_a_reading_its_share_rises_and_people_teach() -> None:
    steps: list = []
    _, shares, _, requests = run([0.0] * 6 + [0.1 * v for v in range(1, 15)], judge=HUMAN_AUDIT, steps=steps)
    assert max(shares) == pytest.approx(MAX) and requests == 1 and steps[0].labels == "people"
    strong: list = []
    run([0.0] * 6 + [0.1 * v for v in range(1, 15)], steps=strong)
    assert strong[0].labels == "strong"


def test_the_kl_brake_doubles_per_version_while_the_alarm_fires_and_comes_back_once_the_gap_closes() -> None:
    steps: list = []
    growing = [0.0] * 6 + [0.1 * v for v in range(1, 15)]
    state, _, decisions, _ = run(growing, judge=HUMAN_AUDIT, strong_growth=0.0, steps=steps, **BRAKE)
    scales = [s.state.kl_scale for s in steps]
    assert scales[:3] == [2.0, 4.0, 8.0] and state.kl_scale == 8.0  # capped at max_kl_scale
    assert "KL coefficient x1 -> x2" in decisions[0] and "share holds at 0.00" in decisions[0]

    state, _, decisions, _ = run([0.0] * 20, state=DefenceState(acted_on=-1, redistil_requested=True, kl_scale=8.0),
                                 judge=HUMAN_AUDIT, strong_growth=0.0, **BRAKE)
    assert state.at_rest and not state.redistil_requested
    assert [d.split("KL coefficient ")[1] for d in decisions] == ["x8 -> x4", "x4 -> x2", "x2 -> x1"]


def test_the_state_reads_back_its_brake_and_the_learner_reads_it_from_the_same_json() -> None:
    from strata.audit import defence_kl_scale

    class Stored:
        def __init__(self, raw: str | None) -> None:
            self.raw = raw

        def get(self, _key: str) -> str | None:
            return self.raw

    state = DefenceState(0.2, 5, True, 4.0)
    assert DefenceState.from_json(state.to_json()) == state
    assert defence_kl_scale(Stored(state.to_json())) == 4.0  # type: ignore[arg-type]
    assert defence_kl_scale(Stored(None)) == 1.0 and defence_kl_scale(Stored("[]")) == 1.0  # type: ignore[arg-type]
    assert defence_kl_scale(Stored('{"kl_scale": "nan"}')) == 1.0  # type: ignore[arg-type]
