"""``strata train`` through the whole stack (scheduler, probe, both generators, reward service,
learner) on the zoo's task, on real Kafka and Redis: the learner updates from the stack's rewards,
the weights reach the Level-1 generator (later rollouts carry the new version), and on held-out
prompts the light-RM reward rises measurably while the oracle score does not fall (issue 6).

"Measurably" is a paired one-sided test: the mean per-prompt change exceeds twice its standard
error (each held-out prompt is sampled with the same seed before and after). Measured on the ci zoo
over 8 updates and 64 prompts, six runs: reward +0.30 / +0.34 / +0.32 / +0.39 / +0.29 / +0.15
(SE 0.105), oracle +0.04 / -0.04 / -0.02 (SE ~0.08); with 192 prompts, reward +0.42 (SE 0.067),
oracle +0.16 (SE 0.052). Before the learner's fixes of this test's commit (per-token importance
weights, a value head that cannot move the policy and starts at the mean return) the same run gave
reward -0.06 to +0.02 and oracle -0.16 to -0.71 (four runs): see docs/learner.md. A learner restart resuming from
its checkpoint is tested in tests/svc_learner.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from stackutil import Tail, submit

from strata.bus import topics
from strata.config import StrataSettings
from strata.v1 import common_pb2
from strata_tools.stack.inprocess import InProcessStack, StackOverrides
from strata_tools.train import TrainOptions, TrainSummary, train

pytestmark = pytest.mark.integration

UPDATES = 8
# Held-out prompts scored before and after. With 64 the paired SE was ~0.105 and one run in six
# (+0.154) fell under 2 SE although the gain is ~0.3: 192 prompts cut the SE by sqrt(3).
EVAL_PROMPTS = 192
# The learner's recipe for this short run (the demo's, see strata_tools/cli/demo_cmd.py): the KL penalty
# on from the first update (the default warm-up spans 100 updates, longer than the whole run).
LEARNER = {"learning_rate": 1e-4, "batch_size": 32, "minibatch_size": 8, "kl_coef": 0.2, "kl_warmup_updates": 0}
# With learning rate 2e-4 and β 0.1 the oracle fell 2.15 -> 1.74 in one run: the ci zoo's light RM
# is gamed as soon as the policy moves faster.


@pytest.fixture(scope="module")
def loop(infra: StrataSettings, zoo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    # A higher audit share than served (0.1): the run's ~20 would-be skips then surely include audits.
    overrides = StackOverrides(scheduler={"audit_share": 0.3}, learner=LEARNER)
    with InProcessStack.start(infra, zoo, tmp_path_factory.mktemp("checkpoints"), overrides) as stack:
        yield {"addresses": stack.addresses, "report_dir": tmp_path_factory.mktemp("reports")}


@pytest.fixture(scope="module")
def summary(infra: StrataSettings, loop: dict) -> TrainSummary:
    # The demo's traffic: a quarter repeats, a quarter paraphrases of prompts sent before.
    options = TrainOptions(updates=UPDATES, prompts_per_round=24, n_samples=2, eval_prompts=EVAL_PROMPTS,
                           report_dir=loop["report_dir"], max_rounds=30, repeat_share=0.25, paraphrase_share=0.25,
                           eval_every=UPDATES // 2)
    result = train(infra, options, loop["addresses"])
    print(f"reward {result.reward_change}, oracle {result.oracle_change}")
    return result


def test_the_learner_updates_from_the_stack_and_reports_paired_changes(summary: TrainSummary) -> None:
    assert summary.end_version - summary.start_version >= UPDATES
    assert [r.policy_version for r in summary.rounds] == sorted(r.policy_version for r in summary.rounds)
    before, after = summary.before, summary.after
    assert before is not None and after is not None and len(before.rewards) == len(after.rewards) == EVAL_PROMPTS
    assert all(0.0 <= x <= 5.0 for x in before.oracle_scores + after.oracle_scores + before.rewards + after.rewards)
    png = Path(summary.png)
    report = json.loads(png.with_suffix(".json").read_text())
    assert png.is_file() and report["end_version"] == summary.end_version
    for name, change in (("reward_change", summary.reward_change), ("oracle_change", summary.oracle_change),
                         ("hacking_gap", summary.hacking_gap)):
        assert change is not None and report[name]["n"] == EVAL_PROMPTS
        assert report[name]["mean"] == change.mean and change.stderr > 0


def test_held_out_checkpoints_follow_the_booked_cost(summary: TrainSummary) -> None:
    """Before, once halfway (eval_every), and after: each with what the run's rollouts had booked by then."""
    checkpoints = summary.checkpoints
    assert len(checkpoints) == 3 and checkpoints[0].evaluation is summary.before
    assert checkpoints[-1].evaluation is summary.after
    assert [c.updates for c in checkpoints] == sorted(c.updates for c in checkpoints)
    assert checkpoints[0].updates == 0 and UPDATES // 2 <= checkpoints[1].updates < UPDATES
    booked = [c.booked.param_tokens for c in checkpoints]
    assert booked[0] < booked[1] < booked[2], booked  # the rounds between them rolled out and were booked
    report = json.loads(Path(summary.png).with_suffix(".json").read_text())
    assert [c["updates"] for c in report["checkpoints"]] == [c.updates for c in checkpoints]


def test_the_light_rm_reward_rises_and_the_oracle_does_not_fall(summary: TrainSummary) -> None:
    reward, oracle = summary.reward_change, summary.oracle_change
    assert reward is not None and oracle is not None
    assert reward.mean > 2 * reward.stderr, f"held-out light-RM reward did not rise measurably: {reward}"
    assert oracle.mean > -2 * oracle.stderr, f"held-out oracle score fell: {oracle}"


def test_new_weights_reach_the_level1_generator(infra: StrataSettings, summary: TrainSummary) -> None:
    """A prompt sent to Level-1 after training is answered by the newest policy version."""
    tail = Tail(infra, topics.REWARDS_SCORED)
    try:
        prompt = f"Explain how a compiler turns source code into machine code ({uuid.uuid4().hex[:6]})."
        requests = submit(infra, [prompt], tier=common_pb2.TIER_LEVEL_1)
        events = tail.read(lambda seen: any(e.request_id in requests for e in seen))
    finally:
        tail.close()
    rollout = next(e for e in events if e.request_id in requests)
    assert rollout.tier == common_pb2.TIER_LEVEL_1
    assert rollout.policy_version >= summary.start_version + UPDATES  # the learner may have gone on since


def test_live_traffic_skips_and_audits_its_skips(loop: dict, summary: TrainSummary) -> None:
    """On a fresh state, repeats and paraphrases are skipped by the live scheduler (R10), and the
    audited skips get fresh rewards to compare with the reused one."""
    import time

    import grpc

    from strata.v1 import scheduler_pb2, scheduler_pb2_grpc

    skipped = sum(r.decisions.get("skip", 0) for r in summary.rounds)
    assert skipped > 0, [r.decisions for r in summary.rounds]
    with grpc.insecure_channel(loop["addresses"].scheduler) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        deadline = time.monotonic() + 60
        while True:  # the statistics worker folds the last round's rewards after train() returns
            stats = stub.Stats(scheduler_pb2.StatsRequest(), timeout=10)
            if (stats.audits and stats.audits_scored == stats.audits) or time.monotonic() > deadline:
                break
            time.sleep(0.2)  # poll interval of a condition read from the service
    assert stats.audits >= 1 and stats.audits_scored == stats.audits, stats
    assert stats.HasField("audit_reuse_mae") and 0.0 <= stats.audit_reuse_mae <= 5.0
    assert stats.skip_rate > 0


def test_the_runs_own_traffic_is_measured_against_all_level2_on_the_same_prompts(
        infra: StrataSettings, summary: TrainSummary) -> None:
    """The demo's headline: a sample of the run's requests sent again straight to Level-2, both sides'
    answers judged by the oracle and costed from the ledger, in the bench's last-line terms."""
    from strata_tools.cli.demo_cmd import baseline_answers, headline_sample
    from strata_tools.tiering.headline import headline_of

    chosen = headline_sample(summary.requests, 16, n_samples=2, seed=0)
    assert len(chosen) == 16 and len({r.prompt_hash for r in chosen}) == 16
    own, base, baseline = baseline_answers(infra, chosen, 2, 300, print)
    assert all(b.level2 is not None and b.level2.param_tokens > 0 for b in base)
    assert [r.prompt_hash for r in baseline.requests] == [r.prompt_hash for r in chosen]
    head = headline_of("demo", own, base, [r.prompt_hash for r in chosen], [False] * 16, 1.5)
    assert head.baseline.level2_share == 1.0 and head.arm.prompts == 16
    assert head.replayed == sum(not a.skipped for a in own)
    # Each side's cost is what the ledger booked for its own requests: a request's Level-1 path (probe, two
    # Level-1 samples and their light-RM scores) costs less than the baseline's two Level-2 samples.
    pairs = [(a.level1, b.level2) for a, b in zip(own, base, strict=True) if a.level1 is not None]
    assert pairs and all(l1.param_tokens < l2.param_tokens for l1, l2 in pairs)  # type: ignore[union-attr]
    assert head.line().startswith("tiers saving=")
