"""``strata bench scheduler`` end to end on a small slice of the suite, through the session's Kafka and Redis."""

from __future__ import annotations

import argparse
import re

import pytest

from strata.config import StrataSettings
from strata_tools.bench import scheduler as bench
from strata_tools.bench.scheduler.common import rule_of
from strata_tools.bench.scheduler.live import audit_error_by_rule
from strata_tools.bench.scheduler.stream import submission_id
from svc_scheduler.config import SchedulerSettings

pytestmark = pytest.mark.integration


@pytest.mark.timeout(600)  # the simulated stream, the real tiers and the latency sizes, end to end on 2 cores
def test_bench_runs_through_kafka_and_prints_both_rules(infra: StrataSettings, zoo, monkeypatch, capsys) -> None:
    monkeypatch.setenv("STRATA_KAFKA_BOOTSTRAP", infra.kafka_address)
    monkeypatch.setenv("STRATA_REDIS_URL", infra.redis_address)
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    # --live: one paraphrase family (7 prompts x 3 passes, where the simulated suite stream has 2) through the
    # real tiers of the ci zoo too, with the learner training the policy on the live rewards.
    args = parser.parse_args(["--limit", "40", "--batch", "8", "--policy-step-every", "4",
                              "--latency-sizes", "300", "--latency-queries", "5", "--n-samples", "3",
                              "--live", "--live-families", "1", "--live-passes", "3", "--live-audit-share", "0.5",
                              "--live-learner", "--compare-cluster-marking", "--error-anatomy"])
    assert bench.run(args) == 0
    out = capsys.readouterr().out
    rows = {m.group(1).strip(): (int(m.group(2)), int(m.group(3)), int(m.group(4)))
            for m in re.finditer(r"^(no skipping|GRESO same-prompt|knn \(Strata\))\s+(\d+)\s+(\d+)\s+\S+\s+(\d+)",
                                 out, re.M)}
    assert set(rows) == {"no skipping", "GRESO same-prompt", "knn (Strata)"}
    assert all(submitted == 80 for submitted, _, _ in rows.values())  # 40 prompts x 2 passes
    live = re.search(r"^knn, real tiers \(zoo \w+\)\s+(\d+)\s+(\d+)\s+\S+\s+(\d+)\s+(\d+)", out, re.M)
    simulated = re.search(r"^knn, simulated tier \(same stream\)\s+(\d+)\s+(\d+)", out, re.M)
    assert live and simulated, out
    assert int(live.group(1)) == int(simulated.group(1)) == 21  # the same stream through both tiers
    live_rules = re.search(r"^live decisions by rule: (.+)$", out, re.M)
    assert live_rules, out
    counts = {name: int(n) for name, n in re.findall(r"(\w[^,]*?) (\d+) \(\d+\.\d%\)", live_rules.group(1))}
    assert sum(counts.values()) == 21 and "other" not in counts, live_rules.group(1)
    assert "policy trained by the learner as it goes" in out
    moved = re.search(r"^live policy: v(\d+) after the first batch -> v(\d+) at the end", out, re.M)
    assert moved and int(moved.group(1)) <= int(moved.group(2)), out
    assert 7 <= int(live.group(2)) <= 21 and int(live.group(4)) == 21 - int(live.group(2))
    assert re.search(r"^live trigger reduction \d\.\d{3} against the simulated tier's \d\.\d{3} on the same stream",
                     out, re.M), out
    submitted, rollouts, _level2 = rows["knn (Strata)"]
    assert 40 <= rollouts < submitted  # every prompt rolled out once at least; some second passes skipped
    anatomy = re.findall(r"^  error anatomy, (.+?): (\d\.\d{3}) against the truth .*, (\d\.\d{3}) against the "
                         r"expected reward \(64 rollouts\), which the truth itself misses by (\d\.\d{3})", out, re.M)
    by_rule = dict(re.findall(r"(\w[^,:]*-> skip) (\d\.\d{3}) over \d+ skips", out))
    assert anatomy and {rule for rule, *_ in anatomy} == set(by_rule), out  # every skip rule, split
    assert all(by_rule[rule] == against_truth for rule, against_truth, _, _ in anatomy)
    assert "policy v1 -> v3" in out  # 10 batches, a policy step every 4
    # The generator served the learner's versions: none of its samples was too many versions behind.
    taken = re.findall(r"^  live batch \d+/\d+: .*\(learner: (\d+) samples taken, (\d+) dropped as stale\)", out, re.M)
    assert taken and int(taken[-1][0]) > 0 and int(taken[-1][1]) == 0, out
    last = out.strip().splitlines()[-1]
    match = re.fullmatch(r"scheduler trigger_reduction=(\d\.\d{3}) reuse_mae=(\d\.\d{3}) "
                         r"greso_trigger_reduction=(\d\.\d{3}) r10_reference=(\d\.\d{3}) "
                         r"live_skip_rate=(\d\.\d{3}) live_reuse_mae=(\d\.\d{3}|nan) live_audits=(\d+) "
                         r"live_reuse_mae_lo=(-?\d\.\d{3}|nan) live_reuse_mae_hi=(\d\.\d{3}|nan) "
                         r"r11_reference=(\d\.\d{3}) "
                         r"decision_p99_ms=[\d.]+ decision_over_limit=[\d.]+ recall_at_10=1\.000 "
                         r"repeat_p99_ms=[\d.]+ level2_share=(\d\.\d{3}) bad_caught=(\d\.\d{3}|nan) "
                         r"flipped_level2_share=(\d\.\d{3}) flipped_bad_caught=(\d\.\d{3}|nan)", last)
    assert match, last
    assert float(match.group(4)) <= float(match.group(10))  # R10 allows less than R11 does
    # The live error's bounds are the report's clustered 95 % interval around it.
    interval = re.search(r"audit reuse error (\d\.\d{3}) ± (\d\.\d{3}) \(95 %\)", out)
    if interval:
        assert float(match.group(8)) == pytest.approx(float(interval.group(1)) - float(interval.group(2)), abs=2e-3)
        assert float(match.group(9)) == pytest.approx(float(interval.group(1)) + float(interval.group(2)), abs=2e-3)
    else:
        assert match.group(8) == match.group(9) == "nan"
    assert float(match.group(1)) == pytest.approx(1 - rollouts / submitted, abs=1e-3)
    assert float(match.group(5)) == pytest.approx(int(live.group(4)) / 21, abs=1e-3)
    audits = re.search(r"fresh light/strong-RM rewards of (\d+) of (\d+) audited skips", out)
    assert audits and int(match.group(7)) == int(audits.group(1)) <= int(audits.group(2))
    assert (match.group(6) == "nan") == (int(match.group(7)) == 0)
    # R11 on the same stream with cluster marking as configured, then flipped: what the last line quotes.
    r11 = {m.group(1): (int(m.group(2)), int(m.group(3)), int(m.group(4)), int(m.group(5))) for m in re.finditer(
        r"^R11 with cluster marking (on|off): (\d+) of (\d+) non-risk submissions to Level-2 \S+; (\d+) of (\d+) bad",
        out, re.M)}
    assert set(r11) == {"on", "off"}
    configured, flipped = ("on", "off") if SchedulerSettings().cluster_marking else ("off", "on")
    for arm, share in ((configured, match.group(11)), (flipped, match.group(13))):
        to_level2, nonrisk, bad_caught, bad = r11[arm]
        assert 0 < nonrisk < 80 and to_level2 <= nonrisk and bad_caught <= bad  # risk prompts are left out
        assert float(share) == pytest.approx(to_level2 / nonrisk, abs=1e-3)


def test_latency_only_times_each_stage_beside_the_decision(infra: StrataSettings, zoo, monkeypatch, capsys) -> None:
    monkeypatch.setenv("STRATA_KAFKA_BOOTSTRAP", infra.kafka_address)
    monkeypatch.setenv("STRATA_REDIS_URL", infra.redis_address)
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(["--latency-only", "--latency-sizes", "200,400", "--latency-queries", "6"])
    assert bench.run(args) == 0
    out = capsys.readouterr().out
    table = re.findall(r"^\s+(200|400)\s+exact\s+[\d.]+\s+\d+\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+"
                       r"([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+1\.000\s+([\d.]+)$", out, re.M)
    assert [row[0] for row in table] == ["200", "400"], out
    for _size, p50, p99, encoder, search, redis_rtt, limit, over, repeat in table:
        assert float(p50) <= float(p99) and float(limit) >= max(float(encoder), float(search), float(redis_rtt))
        assert float(over) == pytest.approx(float(p99) / float(limit), abs=0.02)
        assert float(repeat) > 0
    last = out.strip().splitlines()[-1]
    assert re.fullmatch(r"scheduler decision_p99_ms=[\d.]+ decision_over_limit=[\d.]+ recall_at_10=1\.000 "
                        r"repeat_p99_ms=[\d.]+", last), last


def test_rule_of_names_the_rule_behind_each_reason() -> None:
    from svc_scheduler.config import SchedulerSettings
    from svc_scheduler.routing import Neighbour, Route, VersionState, audit, decide
    from svc_scheduler.stats import RewardStats

    settings, versions, now = SchedulerSettings(), VersionState(1, None), 1000.0

    def known(variance: float) -> RewardStats:
        return RewardStats(5, 3.0, variance * 4, 5.0, 5.0, 1, 1, {"light": "rm"}, now)

    stable = [Neighbour(f"h{i}", 0.9, known(0.1)) for i in range(8)]
    skip = decide("self", stable, None, now, versions, settings)
    assert skip.route is Route.SKIP and rule_of(skip.reason) == "known neighbourhood -> skip"
    assert rule_of(audit(skip, "p", "r", 1.0).reason) == "audited skip -> Level-1"
    own = decide("h0", stable, None, now, versions, settings)
    assert rule_of(own.reason) == "own history -> skip"
    noisy = [Neighbour(f"h{i}", 0.9, known(2.0)) for i in range(8)]
    assert rule_of(decide("x", noisy, None, now, versions, settings).reason) == \
        "uncertain neighbourhood -> Level-2"
    assert rule_of(decide("x", [], None, now, versions, settings).reason) == "too little known -> Level-1"
    failing = RewardStats(4, 1.6, 0.56 * 3, 4.0, 4.0, 1, 1, {"light": "rm"}, now, level1_scored=4.0,
                          level1_escalated=4.0)  # every Level-1 answer escalated, variance 0.56
    before = decide("x", [Neighbour(f"f{i}", 0.8, failing) for i in range(4)], None, now, versions,
                    settings.model_copy(update={"route_before_escalation_rate": 0.8}))
    assert before.route is Route.LEVEL_2 and rule_of(before.reason) == "Level-1's record -> Level-2"
    close = decide("x", stable[:3], None, now, versions, settings.model_copy(update={"min_close_paraphrases": 3}))
    assert close.route is Route.SKIP and rule_of(close.reason) == "close paraphrases -> skip"
    from svc_scheduler.routing import detect_risk

    risky = decide("x", [], detect_risk("What dose of ibuprofen?", {}, settings), now, versions, settings)
    assert rule_of(risky.reason) == "risk topic -> Level-2"


def test_submission_ids_pair_arms_and_reruns_and_follow_the_seed() -> None:
    from strata_tools.bench.simulated_tier import SimulatedPolicy
    from strata_tools.task.suite import PromptRecord

    family = "programming/binary-search/explain_principle"
    record, other = (PromptRecord(id=f"{family}#{k}", text=text, topic="programming", subject="binary search",
                                  intent="explain_principle",
                                  risk=False, family=family, split="train")
                     for k, text in enumerate(("How does binary search work?", "Explain binary search.")))
    same = submission_id(0, 17, record)
    assert same == submission_id(0, 17, record)  # another run or arm: the same draw
    assert len({same, submission_id(1, 17, record), submission_id(0, 18, record),
                submission_id(0, 17, other)}) == 4
    policy = SimulatedPolicy([record, other], seed=0, truth_samples=8)
    assert policy.rewards(record, same, 1, 16) == SimulatedPolicy([record, other], 0, 8).rewards(record, same, 1, 16)
    assert policy.rewards(record, same, 1, 16) != policy.rewards(record, submission_id(1, 17, record), 1, 16)


def test_audit_error_by_rule_scores_each_audit_as_the_scheduler_does() -> None:
    """The would-be skip's rule from the audit's reason; the first n_samples fresh rewards, one per response,
    in arrival order, provisional and reused ones left out; an audit short of fresh rewards is not scored."""
    from strata.v1 import events_pb2
    from strata_tools.train import Request
    from svc_scheduler.config import SchedulerSettings
    from svc_scheduler.routing import Neighbour, VersionState, audit, decide
    from svc_scheduler.stats import RewardStats

    settings, versions, now = SchedulerSettings(), VersionState(1, None), 1000.0
    stable = [Neighbour(f"h{i}", 0.9, RewardStats(5, 3.0, 0.4, 5.0, 5.0, 1, 1, {"light": "rm"}, now))
              for i in range(8)]
    close = audit(decide("x", stable[:3], None, now, versions, settings.model_copy(
        update={"min_close_paraphrases": 3})), "p", "r", 1.0)
    known = audit(decide("self", stable, None, now, versions, settings), "p", "r", 1.0)
    assert close.audited_reward == pytest.approx(3.0) and known.audited_reward == pytest.approx(3.0)

    def reward(response: str, value: float, **fields: object) -> events_pb2.RewardScored:
        return events_pb2.RewardScored(response_hash=response, reward=value, **fields)  # type: ignore[arg-type]

    requests = [
        Request(None, "a", reason=close.reason, events=[
            reward("r1", 2.0, awaiting_annotation=True), reward("r1", 2.5), reward("r2", 3.5), reward("r1", 9.0)]),
        Request(None, "b", reason=known.reason, events=[reward("r3", 4.0), reward("r4", 4.0), reward("r5", 0.0)]),
        Request(None, "c", reason=known.reason, events=[reward("r6", 1.0)]),  # one fresh reward of two
        Request(None, "d", reason="skip: this prompt has ...", events=[reward("r7", 1.0)]),  # not an audit
    ]
    errors = audit_error_by_rule(requests, n_samples=2)
    assert errors == {"close paraphrases -> skip": [pytest.approx(0.0)], "known neighbourhood -> skip": [
        pytest.approx(1.0)]}
