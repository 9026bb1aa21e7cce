"""``strata bench tiers``: prompt choice, live-arm figures with skipped prompts, and a small end-to-end run
through the real services on the session's Kafka and Redis (ci zoo)."""

from __future__ import annotations

import argparse
import json
import re
from types import SimpleNamespace

import pytest

from strata.config import StrataSettings
from strata.errors import CliError
from strata.models.loading import params_on_disk
from strata.v1 import common_pb2
from strata_tools.bench import tiers, tiers_epochs
from strata_tools.rm.ensemble import write_ensemble
from strata_tools.rm.recipe import student_init_dir
from strata_tools.tiering import tier_eval
from strata_tools.tiering.answers import Answers, answers_of, baseline_figures, live_figures
from strata_tools.tiering.arms import ArmRun, ArmRunner
from strata_tools.tiering.headline import (
    HEADLINE_ARM,
    apgr_interval,
    escalation_auc,
    headline_intervals,
    headline_line,
    headline_of,
)
from strata_tools.tiering.lines import ceiling_lines
from strata_tools.tiering.tier_eval import Answer, all_level2, compare
from strata_tools.tiering.tier_eval import PromptOutcome as Outcome
from strata_tools.train import Request

TIER1, TIER2 = common_pb2.TIER_LEVEL_1, common_pb2.TIER_LEVEL_2


def _record(i: int, risk: bool) -> SimpleNamespace:
    return SimpleNamespace(text=f"prompt {i}", risk=risk, topic=f"topic {i % 3}", family=f"family {i % 20}")


def test_pick_prompts_keeps_the_risk_share_and_is_seeded() -> None:
    records = [_record(i, i % 4 == 0) for i in range(100)]  # 25 % risk
    chosen = tiers.pick_prompts(records, 20, seed=3)
    assert len(chosen) == 20 and len({r.text for r in chosen}) == 20
    assert sum(r.risk for r in chosen) == 5
    assert [r.text for r in chosen] == [r.text for r in tiers.pick_prompts(records, 20, seed=3)]
    assert sum(r.risk for r in tiers.pick_prompts(records[:8], 3, seed=0)) == 1  # at least one risk prompt


def test_prompt_mixes_are_nested_at_their_risk_shares_and_seeded() -> None:
    records = [_record(i, i % 4 == 0) for i in range(200)]  # 50 risk
    mixes = tiers.prompt_mixes(records, 96, seed=5, risk_share=0.06, stress_share=0.25)
    assert len(mixes.default) == len(mixes.stress) == 96
    assert sum(r.risk for r in mixes.default) == 6 and sum(r.risk for r in mixes.stress) == 24
    default, stress, union = ({r.text for r in m} for m in (mixes.default, mixes.stress, mixes.union))
    # One live run serves both: the union is exactly both mixes, 90 safe + 24 risk prompts.
    assert union == default | stress and len(mixes.union) == len(union) == 114
    assert {r.text for r in mixes.default if r.risk} <= stress
    assert {r.text for r in mixes.stress if not r.risk} <= default
    # Each mix keeps the union's order, and the seed fixes every choice.
    position = {r.text: i for i, r in enumerate(mixes.union)}
    assert [position[r.text] for r in mixes.default] == sorted(position[r.text] for r in mixes.default)
    again = tiers.prompt_mixes(records, 96, seed=5, risk_share=0.06, stress_share=0.25)
    assert [r.text for r in again.union] == [r.text for r in mixes.union]
    assert {r.text for r in tiers.prompt_mixes(records, 96, 6, 0.06, 0.25).default} != default
    # No stress mix: the union is the default mix; a tiny share still keeps one risk prompt.
    alone = tiers.prompt_mixes(records, 10, seed=0, risk_share=0.01, stress_share=0.0)
    assert alone.stress == [] and [r.text for r in alone.union] == [r.text for r in alone.default]
    assert sum(r.risk for r in alone.default) == 1
    assert sum(r.risk for r in tiers.prompt_mixes(records, 10, 0, 0.0, 0.0).default) == 0
    with pytest.raises(ValueError):
        tiers.prompt_mixes(records, 10, 0, 1.5, 0.25)


def test_subset_keeps_each_prompts_request_and_answers_together() -> None:
    union = [_record(i, False) for i in range(4)]
    requests = [Request(r, f"id-{i}") for i, r in enumerate(union)]
    runs = {"tiered": ArmRun("tiered", requests, [], 1.0), "history": ArmRun("history", [], [], 2.0)}
    answers = {"tiered": [f"answer-{i}" for i in range(4)]}
    records, sub_runs, sub_answers = tiers.subset(union, [union[3], union[1]], runs, answers)  # type: ignore[arg-type]
    assert [r.text for r in records] == ["prompt 1", "prompt 3"]
    assert [r.request_id for r in sub_runs["tiered"].requests] == ["id-1", "id-3"]
    assert sub_answers["tiered"] == ["answer-1", "answer-3"]
    assert sub_runs["history"] is runs["history"]


def test_live_figures_cost_skips_their_encoding_and_leave_them_out_of_quality() -> None:
    level2 = [Answer(4.0, 3.9, 10.0, 100.0) for _ in range(3)]
    baseline_outcomes = [Outcome(h, None, a) for h, a in zip("abc", level2, strict=True)]
    baseline = compare(all_level2(baseline_outcomes, 1.5), all_level2(baseline_outcomes, 1.5))
    answers = [
        Answers(Answer(3.0, 3.5, 1.0, 5.0), None, False, 0.0, (0.1, 1.0)),                  # stays at Level-1
        Answers(Answer(1.0, 2.0, 1.0, 5.0), Answer(4.0, 3.8, 10.0, 100.0), True, 60.0,    # escalated
                      (0.1, 1.0)),
        Answers(None, None, False, 0.0, (0.1, 1.0), skipped=True),                        # reused reward
    ]
    figures = live_figures("skip arm", answers, list("abc"), level2, 1.5, baseline)
    assert figures.prompts == 3
    # 1.0 + 0.1 (a) + 1.0 + 10.0 + 0.1 (b) + 0.1 (c's encoding only)
    assert figures.device_seconds == pytest.approx(12.3)
    assert figures.mean_oracle == pytest.approx((3.0 + 4.0) / 2)  # the skipped prompt has no answer
    assert figures.level2_share == pytest.approx(1 / 3)
    assert figures.bad_case_catch == 1.0 and figures.false_escalation == 0.0
    assert figures.saving == pytest.approx(1 - 12.3 / 30.0)
    assert figures.human_seconds == 60.0


LINE = re.compile(r"tiers saving=(\S+) device_saving=(\S+) quality_ratio=(\S+) bad_case_catch=(\S+) "
                  r"level2_share=(\d\.\d{3}) apgr=(\S+) ceiling_share_of_saving=(\S+)"
                  r"(?: saving_lo=(\S+) saving_hi=(\S+) quality_ratio_lo=(\S+) quality_ratio_hi=(\S+))?"
                  r"(?: apgr_lo=(\S+) apgr_hi=(\S+))?(?: escalation_auc=(\S+))?")


def test_headline_of_sets_a_runs_own_traffic_against_its_baseline_on_the_same_prompts() -> None:
    def l2(oracle: float) -> Answer:
        return Answer(oracle, 3.9, 10.0, 100.0)

    baseline = [Answers(None, l2(o), False, 60.0, (0.0, 0.0)) for o in (4.0, 4.0, 3.0, 2.5)]
    own = [
        Answers(Answer(3.0, 3.5, 1.0, 5.0), None, False, 0.0, (0.1, 1.0)),               # stays at Level-1
        Answers(Answer(1.0, 2.0, 1.0, 5.0), l2(4.0), True, 60.0, (0.1, 1.0)),           # escalated bad case
        Answers(None, None, False, 0.0, (0.1, 1.0), skipped=True),                      # reused reward
        Answers(None, l2(2.5), False, 60.0, (0.1, 1.0)),                                # cautious: Level-2
    ]
    head = headline_of("own", own, baseline, list("abcd"), [False, False, False, True], 1.5)
    assert head.baseline.param_tokens == 400.0 and head.baseline.level2_share == 1.0
    # 5 + 1 (a) + 5 + 100 + 1 (b) + 1 (c: its encoding) + 100 + 1 (d)
    assert head.arm.param_tokens == pytest.approx(214.0)
    assert head.arm.param_token_saving == pytest.approx(1 - 214.0 / 400.0)
    assert head.arm.level2_share == pytest.approx(2 / 4) and head.arm.bad_case_catch == 1.0
    assert head.arm.mean_oracle == pytest.approx((3.0 + 4.0 + 2.5) / 3)  # the skipped prompt has no answer
    # The replay keeps the prompts with answers of their own, against all-Level-2 on those three.
    assert head.replayed == 3 and head.sweep.strong == pytest.approx((4.0 + 4.0 + 2.5) / 3)
    assert head.oracle_router.bad_case_catch == 1.0
    match = LINE.fullmatch(head.line())
    assert match and float(match.group(1)) == pytest.approx(head.arm.param_token_saving, abs=1e-3)
    assert float(match.group(5)) == pytest.approx(0.5)
    # Quality against the baseline on the prompts served (c was skipped): 3.1667 / 3.5.
    assert head.arm.quality_ratio == pytest.approx(((3.0 + 4.0 + 2.5) / 3) / ((4.0 + 4.0 + 2.5) / 3))
    # The oracle router escalates the bad case b; cautious d is at Level-2 anyway: 5 + (5 + 100) + 100.
    assert head.oracle_router.param_tokens == pytest.approx(210.0)
    # With two Level-2 samples per baseline prompt, a replayed escalation buys one of them, as a live one
    # does; the prompt sent straight to Level-2 still rolls out both.
    two = headline_of("own", own, baseline, list("abcd"), [False, False, False, True], 1.5, level2_samples=2)
    assert two.oracle_router.param_tokens == pytest.approx(5 + (5 + 50) + 100)
    assert two.baseline.param_tokens == head.baseline.param_tokens  # the baseline itself is what it booked
    # One sample per prompt, the cautious prompt d has no Level-1 answer: no RouteLLM figures.
    assert head.apgr is None and not head.sweep.expected
    # The served router is what the run escalated (b): its saving against the ceiling's at quality >= .95.
    assert head.sweep.router.level2_share == pytest.approx(2 / 3)
    # Expected Level-2 scores (several samples a prompt) replace Level-2's one sample; the Level-1 answers the
    # router saw stay, and cautious d's expected Level-1 score starts the axis.
    expected = {"a": tier_eval.ExpectedScores(3.5, 4), "b": tier_eval.ExpectedScores(3.5, 4),
                "c": tier_eval.ExpectedScores(3.0, 4), "d": tier_eval.ExpectedScores(3.0, 4, level1=1.0)}
    scored = headline_of("own", own, baseline, list("abcd"), [False, False, False, True], 1.5,
                               expected=expected)
    assert scored.sweep.expected and scored.sweep.strong == pytest.approx(10 / 3)
    # All at Level-1: (3 + 1 + 1) / 3; d first (+2), then b by its light-RM score (+2.5), then a (+.5).
    points = [(0.0, 5 / 3), (1 / 3, 7 / 3), (2 / 3, 9.5 / 3), (1.0, 10 / 3)]
    assert scored.apgr == pytest.approx(tier_eval.apgr(points, 5 / 3, 10 / 3))
    assert scored.arm == head.arm  # the live arm's own figures stay what the run served
    with pytest.raises(ValueError, match="without a Level-2 answer"):
        headline_of("own", own, [*baseline[:3], own[0]], list("abcd"), [False] * 4, 1.5)
    with pytest.raises(ValueError, match="every prompt was skipped"):
        headline_of("own", [own[2]], [baseline[2]], ["c"], [False], 1.5)
    with pytest.raises(ValueError, match="one own answer"):
        headline_of("own", own[:3], baseline, list("abcd"), [False] * 4, 1.5)


def test_a_requests_answers_cover_every_sample_and_its_whole_cost(infra: StrataSettings) -> None:
    """Two Level-1 samples, one escalated: the Level-1 answer's reward is the lower (what escalated), its
    oracle score the samples' mean, and each tier's cost is what the ledger booked for every sample."""
    import uuid

    from strata import ledger, redis_client
    from strata.content_store import ContentStore
    from strata.v1 import events_pb2
    from strata_tools.task.oracle import judge
    from strata_tools.task.suite import load_suite

    record = load_suite("eval")[0]
    client = redis_client.connect(infra.redis_address)
    store = ContentStore(client, infra.content_ttl_s, infra.content_max_bytes)
    try:
        prompt = store.put(record.text)
        texts = ["A short answer.", f"A careful answer about {record.text}", "Level two's answer."]
        hashes = [store.put(t) for t in texts]
        request = Request(record, f"answers-{uuid.uuid4().hex[:8]}", prompt)
        light, strong = common_pb2.SCORER_LIGHT, common_pb2.SCORER_STRONG
        request.events = [
            events_pb2.RewardScored(tier=TIER1, sample_index=0, response_hash=hashes[0], reward=3.6, scorer=light,
                                    final=True),
            events_pb2.RewardScored(tier=TIER1, sample_index=1, response_hash=hashes[1], reward=2.1, scorer=light,
                                    escalated=True),
            events_pb2.RewardScored(tier=TIER1, sample_index=1, response_hash=hashes[1], reward=2.1, scorer=light,
                                    escalated=True),  # redelivered
            events_pb2.RewardScored(tier=TIER2, sample_index=0, response_hash=hashes[2], reward=4.0, scorer=strong,
                                    final=True),
        ]
        ledger.book(client, prompt, request.request_id, [
            ledger.Charge("probe", 0, 10, 0.1, 1e3), ledger.Charge("generate", 1, 40, 1.0, 4e4, items=2),
            ledger.Charge("rm_light", 1, 60, 0.2, 6e4, items=2), ledger.Charge("generate", 2, 20, 2.0, 2e5),
            ledger.Charge("rm_strong", 2, 30, 0.3, 3e5), ledger.Charge("encoder", 0, 10, 0.05, 2e5)], ttl_s=60)
        answers = answers_of(request, client, store)
    finally:
        client.close()
    assert answers.escalated and not answers.skipped and answers.level1 and answers.level2
    assert answers.level1.rm == 2.1
    assert answers.level1.oracle == pytest.approx((judge(record, texts[0]).score + judge(record, texts[1]).score) / 2)
    assert answers.level1.param_tokens == pytest.approx(1e3 + 4e4 + 6e4)  # probe, both samples, both RM scores
    assert answers.level2.param_tokens == pytest.approx(2e5 + 3e5) and answers.encoder[1] == pytest.approx(2e5)


def test_an_arm_settles_once_each_answer_has_its_one_rm_score_booked(infra: StrataSettings) -> None:
    """An answer that awaits the desk gets a provisional and a final event, but one RM score in the ledger."""
    import uuid

    from strata import ledger, redis_client
    from strata.v1 import events_pb2

    strong, human = common_pb2.SCORER_STRONG, common_pb2.SCORER_HUMAN
    prompt = uuid.uuid4().hex
    request = Request(_record(0, False), f"settle-{prompt[:8]}", prompt)
    # Two samples of one text (a tiny model repeats itself): still two answers, each scored once.
    request.events = [events_pb2.RewardScored(tier=TIER2, sample_index=i, response_hash="a", scorer=strong, final=False)
                      for i in (0, 1)]
    request.events += [events_pb2.RewardScored(tier=TIER2, sample_index=0, response_hash="a", scorer=human, final=True),
                       events_pb2.RewardScored(tier=TIER2, sample_index=1, response_hash="a", scorer=strong,
                                           final=True)]  # expired: the strong RM's reward kept
    client = redis_client.connect(infra.redis_address)
    try:
        before = ledger.read_stages(client)
        ledger.book(client, prompt, request.request_id,
                    [ledger.Charge("rm_strong", 2, 40, 0.5, 4e6, items=2)], ttl_s=60)
        stages = ArmRunner(infra, "settle", seed=0)._settled_stages(client, before, [request])
    finally:
        client.close()
    assert [(s.stage, s.items) for s in stages if s.items] == [("rm_strong", 2)]


def test_the_epoch_stream_reshuffles_each_pass_and_is_read_back_in_prompt_order() -> None:
    records = [_record(i, False) for i in range(30)]
    second, third = tiers_epochs.epoch_order(records, 2, seed=0), tiers_epochs.epoch_order(records, 3, seed=0)
    assert sorted(r.text for r in second) == sorted(r.text for r in records)  # every prompt, once
    assert [r.text for r in second] != [r.text for r in third] != [r.text for r in records]
    assert [r.text for r in tiers_epochs.epoch_order(records, 2, seed=0)] == [r.text for r in second]  # seeded
    run = ArmRun("e2", [Request(r, f"id-{r.text}") for r in second], [], 1.0)
    assert [r.request_id for r in tiers_epochs.in_order_of(records, run).requests] == [f"id-{r.text}" for r in records]
    with pytest.raises(ValueError):
        tiers_epochs.in_order_of(records[:-1], run)
    assert [tiers_epochs.epoch_arm(e) for e in (1, 2)] == [HEADLINE_ARM, f"{HEADLINE_ARM}, epoch 2"]


def test_epoch_rows_show_what_skipping_adds_once_prompts_have_a_history() -> None:
    level2 = [Answer(4.0, 3.9, 10.0, 100.0) for _ in range(4)]
    outcomes = [Outcome(h, None, a) for h, a in zip("abcd", level2, strict=True)]
    baseline = compare(all_level2(outcomes, 1.5), all_level2(outcomes, 1.5))
    served = Answers(Answer(3.0, 3.5, 1.0, 20.0), None, False, 0.0, (0.1, 5.0))
    skipped = Answers(None, None, False, 0.0, (0.1, 5.0), skipped=True)
    answers = {tiers_epochs.epoch_arm(1): [served] * 4, tiers_epochs.epoch_arm(2): [served, skipped, skipped, served],
               tiers_epochs.epoch_arm(4): [skipped] * 4}  # epoch 3 did not run: the stream ends at 2
    rows = tiers_epochs.epoch_figures(answers, list("abcd"), level2, 1.5, baseline)
    assert [(epoch, skipped_n) for epoch, skipped_n, _ in rows] == [(1, 0), (2, 2)]
    first, second = rows[0][2], rows[1][2]
    assert first.param_tokens == 4 * 25.0 and second.param_tokens == 2 * 25.0 + 2 * 5.0
    assert second.param_token_saving == pytest.approx(1 - 60.0 / 400.0)
    lines = tiers_epochs.epoch_lines(rows, first, tiers_epochs.Audits(3, 3, 0.41, 0.12, 1))
    assert lines[3].split()[:4] == ["2", "50.0%", "85.0%", "+10.0"]
    assert "3 of 3 audited skips scored, 1 erred" in lines[-1] and "whole run" in lines[-1]
    assert "reuse error (MAE) 0.410 ± 0.120 (95 %)" in lines[-1]
    assert tiers_epochs.epoch_lines([], first, None) == []


def _arm(name: str, share: float, saving: float, quality: float):
    from strata_tools.tiering.tier_eval import ArmFigures

    return ArmFigures(name, 100, 1.0, 1.0, 0.0, quality, share, None, None, saving, saving, quality)


def test_ceiling_lines_name_what_no_router_can_reach() -> None:
    best = [_arm("k=0", 0.3, 0.45, 0.84), _arm("k=1", 0.4, 0.35, 0.93), _arm("k=2", 0.6, 0.1, 0.96)]
    lines = ceiling_lines(best, _arm("oracle", 0.41, 0.3, 0.9))
    assert "unreachable: cautious prompts alone are 30.0%" in lines[3]
    assert lines[4].split()[-4:] == ["40.0%", "35.0%", "35.0%", "0.930"]
    assert lines[5].split()[-4:] == ["60.0%", "10.0%", "10.0%", "0.960"]
    with_router = ceiling_lines(best, _arm("oracle", 0.41, 0.3, 0.9), _arm("tiered", 0.58, -0.1, 0.95))
    assert "at the tiered arm's share" in with_router[5] and with_router[5].split()[-4:-2] == ["60.0%", "10.0%"]
    lines = ceiling_lines([_arm("k=0", 0.2, 0.5, 0.84), *best[:2]], best[0])
    assert lines[3].split()[-4:] == ["20.0%", "50.0%", "50.0%", "0.840"]
    assert lines[-1].endswith("unreachable by any router")


def test_bench_runs_every_arm_through_the_services(infra: StrataSettings, zoo, monkeypatch, capsys,
                                                   tmp_path) -> None:
    monkeypatch.setenv("STRATA_KAFKA_BOOTSTRAP", infra.kafka_address)
    monkeypatch.setenv("STRATA_REDIS_URL", infra.redis_address)
    monkeypatch.setenv("STRATA_ZOO_PRESET", "ci")
    parser = argparse.ArgumentParser()
    tiers.add_arguments(parser)
    # Level-2 judged by a strong RM of two members (the zoo's, and its model before growth), served as one.
    members = [zoo.rm_strong, student_init_dir(zoo.rm_strong)]
    write_ensemble(members, tmp_path / "strong-ensemble")
    args = parser.parse_args(["--prompts", "8", "--history", "4", "--epochs", "3", "--out", str(tmp_path),
                              "--strong-rm", str(tmp_path / "strong-ensemble")])
    assert tiers.run(args) == 0
    out = capsys.readouterr().out
    assert f"strong RM {tmp_path / 'strong-ensemble'} (given, not the zoo's)" in out
    figures = json.loads((tmp_path / "tiers.json").read_text())
    assert (tmp_path / "tiers.png").stat().st_size > 0
    arms = {a["name"]: a for a in figures["arms"]}
    assert {"all-Level-2", "tiered (live)", "tiered + skip (live)", "random router",
            "oracle router (replay)"} <= set(arms)
    baseline, tiered = arms["all-Level-2"], arms["tiered (live)"]
    assert baseline["level2_share"] == 1.0 and baseline["prompts"] == tiered["prompts"] == 8
    # Every arm booked real work: the baseline generation and the strong RM; the tiered arm the probe too.
    stages = {name: {(s["stage"], s["tier"]) for s in rows if s["items"]} for name, rows in figures["stages"].items()}
    assert {("generate", 2), ("rm_strong", 2), ("human_review", 2)} <= stages["all-Level-2"]
    # Booked at the parameters it runs: both members.
    strong_params = {s["params"] for s in figures["stages"]["all-Level-2"] if s["stage"] == "rm_strong" and s["items"]}
    assert strong_params == {float(sum(params_on_disk(m) for m in members))}
    assert ("probe", 0) in stages["tiered"] and ("encoder", 0) in stages["tiered + skip"]
    assert ("encoder", 0) not in stages["tiered"]
    assert tiered["saving"] == pytest.approx(1 - tiered["device_seconds"] / baseline["device_seconds"])
    # The ceiling (expected quality, gain per cost) bounds every threshold of the sweep on the same expected
    # scores: at each threshold's cost, the ceiling's curve is at least as good.
    ceiling = [(a["param_tokens"], a["mean_oracle"]) for a in figures["ceiling"]]
    for arm in figures["sweep"]:
        below = max((c for c in ceiling if c[0] <= arm["param_tokens"] + 1e-6), key=lambda c: c[0])
        above = min((c for c in ceiling if c[0] >= arm["param_tokens"] - 1e-6), key=lambda c: c[0])
        reach = below[1] if above[0] == below[0] else below[1] + (above[1] - below[1]) * (
            (arm["param_tokens"] - below[0]) / (above[0] - below[0]))
        assert reach >= arm["mean_oracle"] - 1e-9, (arm, below, above)
    assert figures["route_llm"]["weak"] is not None and figures["route_llm"]["apgr"] is not None
    assert "ceiling (any router" in out
    last = out.strip().splitlines()[-1]
    match = LINE.fullmatch(last)
    assert match, last
    skip_arm = arms["tiered + skip (live)"]
    assert float(match.group(5)) == pytest.approx(skip_arm["level2_share"], abs=1e-3)
    assert float(match.group(1)) == pytest.approx(skip_arm["param_token_saving"], abs=1e-3)
    # The headline's bounds (bootstrap over paraphrase families) hold its figures.
    assert None not in match.group(8, 9, 10, 11, 12, 13), last
    assert float(match.group(8)) <= float(match.group(1)) <= float(match.group(9))
    assert float(match.group(10)) <= float(match.group(3)) <= float(match.group(11))
    # The stress mix is read off the same live run: more risk prompts, the union of both mixes ran.
    assert figures["stress"]["risk_prompts"] > figures["risk_prompts"]
    assert figures["live_prompts"] > figures["prompts"] == 8 and "stress mix:" in out
    # The epoch stream: the skip arm and two more passes of the same prompts, each costed against all-Level-2.
    assert [e["epoch"] for e in figures["epochs"]] == [1, 2, 3] and "the training-shaped stream" in out
    assert figures["epochs"][0]["param_token_saving"] == pytest.approx(skip_arm["param_token_saving"])
    assert all(0 <= e["skipped"] <= 8 and e["prompts"] == 8 for e in figures["epochs"])
    assert figures["audits"]["scored"] <= figures["audits"]["audits"]


def test_with_a_desk_the_rule_on_the_record_is_served_and_the_labels_are_booked(
        infra: StrataSettings, zoo, monkeypatch, capsys, tmp_path) -> None:
    # --label-share: a desk of simulated annotators scores that share of Level-1 answers (the scheduler's
    # record), and the escalation rule on the record, fitted first, is served with a copy of the light RM.
    from strata.contract.checksums import weights_checksum
    from svc_reward.escalation_rule import EscalationRule

    monkeypatch.setenv("STRATA_KAFKA_BOOTSTRAP", infra.kafka_address)
    monkeypatch.setenv("STRATA_REDIS_URL", infra.redis_address)
    monkeypatch.setenv("STRATA_ZOO_PRESET", "ci")
    parser = argparse.ArgumentParser()
    tiers.add_arguments(parser)
    args = parser.parse_args(["--prompts", "4", "--history", "4", "--epochs", "2", "--expected-samples", "1",
                              "--stress-risk-share", "0", "--label-share", "1", "--record-rounds", "1",
                              "--out", str(tmp_path)])
    assert tiers.run(args) == 0
    out = capsys.readouterr().out
    assert "escalation rule served: on light" in out and "1 earlier rounds at 100% labelled" in out
    rule = EscalationRule.from_dict(json.loads((tmp_path / "escalation_rule.json").read_text()))
    assert rule.checksum == weights_checksum([str(zoo.light_rm)])  # its copy of the light RM: the same weights
    scored = re.search(r"\[desk\] (\d+) items scored", out)
    assert scored and int(scored.group(1)) > 0, out
    figures = json.loads((tmp_path / "tiers.json").read_text())
    stages = {name: {(s["stage"], s["tier"]) for s in rows if s["items"]} for name, rows in figures["stages"].items()}
    assert ("human_review", 1) in stages["tiered"]  # every Level-1 answer went to the desk, at its human cost


def test_a_missing_rm_directory_is_refused_before_anything_starts(tmp_path) -> None:
    parser = argparse.ArgumentParser()
    tiers.add_arguments(parser)
    for flag in ("--light-rm", "--strong-rm"):
        with pytest.raises(CliError, match=flag):
            tiers.run(parser.parse_args([flag, str(tmp_path / "none")]))


def test_the_desks_flags_are_refused_before_anything_starts() -> None:
    parser = argparse.ArgumentParser()
    tiers.add_arguments(parser)
    for argv, message in ((["--label-share", "1.5"], "--label-share must be in"),
                          (["--label-share", "0"], "--label-share must be in"),
                          (["--label-share", "0.2", "--record-rounds", "0"], "--record-rounds must be >= 1 with")):
        with pytest.raises(CliError, match=message):
            tiers.run(parser.parse_args(argv))


def test_the_headline_carries_intervals_from_resampling_whole_families() -> None:
    def l2(oracle: float) -> Answer:
        return Answer(oracle, 3.0, 10.0, 100.0)

    # Two families of two prompts. Family "x": the arm keeps both at Level-1 for 6 params x tokens each,
    # quality 3 against the baseline's 4; family "y": both escalated, paying 5 + 100 for the baseline's quality.
    baseline = [Answers(None, l2(o), False, 0.0, (0.0, 0.0)) for o in (4.0, 4.0, 2.0, 2.0)]
    own = [Answers(Answer(3.0, 3.5, 1.0, 5.0), None, False, 0.0, (0.1, 1.0)),
           Answers(Answer(3.0, 3.5, 1.0, 5.0), None, False, 0.0, (0.1, 1.0)),
           Answers(Answer(1.0, 2.0, 1.0, 4.0), l2(2.0), True, 0.0, (0.1, 1.0)),
           Answers(Answer(1.0, 2.0, 1.0, 4.0), l2(2.0), True, 0.0, (0.1, 1.0))]
    intervals = headline_intervals("own", own, baseline, list("abcd"), [False] * 4, ["x", "x", "y", "y"],
                                         1.5, seed=1, draws=200)
    # Whole sample: cost 6 + 6 + 105 + 105 = 222 against 400 (saving 0.445); quality 10 / 12.
    assert intervals.saving.estimate == pytest.approx(1 - 222 / 400)
    assert intervals.quality_ratio.estimate == pytest.approx(10 / 12)
    # A resample holds x twice (saving 0.94, quality 0.75), y twice (-0.05, 1.0) or both: the bounds are those.
    assert intervals.saving.low == pytest.approx(1 - 210 / 200) and intervals.saving.high == pytest.approx(0.94)
    assert intervals.quality_ratio.low == pytest.approx(0.75) and intervals.quality_ratio.high == pytest.approx(1.0)
    assert intervals.saving.clusters == 2
    line = headline_line(live_figures("own", own, list("abcd"), [b.level2 for b in baseline], 1.5,
                                                  baseline_figures(list("abcd"), baseline, [False] * 4,
                                                                         1.5)[1]), 0.7, 0.5, intervals)
    assert line.endswith("saving_lo=-0.050 saving_hi=0.940 quality_ratio_lo=0.750 quality_ratio_hi=1.000")


def test_the_apgr_interval_resamples_families_and_holds_the_estimate() -> None:
    # Four families of two prompts; the light RM ranks bad Level-1 answers lowest except in family "d".
    def outcome(h: str, l1_oracle: float, rm: float, l2_oracle: float) -> Outcome:
        return Outcome(h, Answer(l1_oracle, rm, 1.0, 10.0), Answer(l2_oracle, 4.0, 5.0, 100.0))

    replay = [outcome("a1", 1.0, 1.0, 4.0), outcome("a2", 1.2, 1.1, 4.0), outcome("b1", 3.0, 3.0, 3.2),
              outcome("b2", 3.1, 3.2, 3.3), outcome("c1", 2.0, 2.0, 3.5), outcome("c2", 2.2, 2.1, 3.4),
              outcome("d1", 1.0, 3.9, 4.0), outcome("d2", 4.0, 1.5, 3.0)]
    families = ["a", "a", "b", "b", "c", "c", "d", "d"]
    interval = apgr_interval(replay, families, seed=2, draws=200)
    assert interval is not None
    points = tier_eval.route_llm_curve(replay)
    expected = tier_eval.apgr(points, points[0][1], points[-1][1])
    assert interval.estimate == pytest.approx(expected) and interval.clusters == 4
    assert interval.low <= interval.estimate <= interval.high and interval.low < interval.high
    assert apgr_interval(replay, families, seed=2, draws=200) == interval
    # A cautious prompt without a Level-1 answer leaves RouteLLM's axis without its 0 % end: no APGR.
    assert apgr_interval([*replay, Outcome("e1", None, Answer(4.0, 4.0, 5.0, 100.0))],
                               [*families, "e"]) is None


def test_the_first_two_arms_alternate_and_their_halves_merge() -> None:
    from strata.ledger import StageCost

    order = tiers.alternated_order(list(range(5)))
    assert [(name, part) for name, _, part, _, _ in order] == [("all-Level-2", 1), ("tiered", 1), ("tiered", 2),
                                                             ("all-Level-2", 2)]
    assert order[0][1] == order[1][1] == [0, 1] and order[2][1] == order[3][1] == [2, 3, 4]
    # Each half is seeded from its place in the whole list: the arms stay paired prompt by prompt.
    assert [first for *_, first in order] == [0, 0, 2, 2]
    first = ArmRun("tiered", ["r0"], [StageCost("generate", 1, 2, 10, 1.0, 50.0)], 3.0)  # type: ignore[list-item]
    second = ArmRun("tiered", ["r1"], [StageCost("generate", 1, 1, 5, 0.5, 25.0),  # type: ignore[list-item]
                                             StageCost("probe", 0, 1, 4, 0.1, 8.0)], 2.0)
    both = tiers.merged(first, second)
    assert both.requests == ["r0", "r1"] and both.wall_s == 5.0
    assert {(s.stage, s.items, s.tokens, s.param_tokens) for s in both.stages} == {("generate", 3, 15, 75.0),
                                                                                 ("probe", 1, 4, 8.0)}


def test_the_escalation_auc_reads_the_light_rms_reward_against_the_oracle_on_level1_answers() -> None:
    def outcome(rm: float, oracle: float, risk: bool = False) -> Outcome:
        return Outcome(f"h{rm}{oracle}", Answer(oracle, rm, 1.0, 1.0), Answer(4.0, 4.0, 2.0, 2.0), risk)

    # Bad answers (oracle < 2) at rewards 1 and 3; good ones at 2 and 4: 3 of the 4 (bad, good) pairs ordered.
    replay = [outcome(1.0, 1.0), outcome(3.0, 1.5), outcome(2.0, 3.0), outcome(4.0, 4.0),
              outcome(0.0, 4.0, risk=True)]  # risk prompts never reach Level-1's rule: left out
    assert escalation_auc(replay, bad_threshold=2.0) == 0.75
    assert escalation_auc(replay[2:4], bad_threshold=2.0) is None  # no bad answer: no AUC
    arm = tier_eval.ArmFigures("x", 4, 1.0, 1.0, 0.0, 3.0, 0.25, 1.0, 0.0)
    line = headline_line(arm, None, None, escalation_auc=0.75)
    assert LINE.fullmatch(line) and line.endswith(" escalation_auc=0.750")
