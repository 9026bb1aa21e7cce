"""Issue 6 acceptance: ``strata train`` through the whole stack (scheduler, probe, both generators,
reward service, learner) on the zoo's task, on real Kafka and Redis.

After a fixed small budget the policy's light-RM reward on held-out prompts rises, the oracle's
score does not fall, and the weights reach the Level-1 generator (later rollouts carry the new
version). A learner restart resuming from its checkpoint is tested in tests/svc_learner.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from stackutil import Tail

from strata.bus import topics
from strata.bus.admin import start_group_at_end
from strata.config import StrataSettings
from strata.service import ServiceParts, start_service, stop_service
from strata.train import Addresses, TrainOptions, TrainSummary, train
from strata.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc

pytestmark = pytest.mark.integration

UPDATES = 6
# The learner's recipe for this short run (the demo's, see strata/cli/demo_cmd.py): the KL penalty
# on from the first update (the default warm-up spans 100 updates, longer than the whole run).
LEARNER = {"learning_rate": 1e-4, "batch_size": 32, "minibatch_size": 8, "kl_coef": 0.2, "kl_warmup_updates": 0}
# Measured (ci zoo, 48 held-out prompts, this recipe): reward 3.47 -> 3.68, oracle 2.15 -> 2.06 (not a
# significant fall). With learning rate 2e-4 and β 0.1 the oracle fell 2.15 -> 1.74: the ci zoo's
# light RM is gamed as soon as the policy moves faster.


def service_settings(infra: StrataSettings, **extra: object) -> dict:
    return {"kafka_bootstrap": infra.kafka_address, "redis_url": infra.redis_address, "device": "cpu",
            "grpc_port": 0, "consumer_session_timeout_ms": 6000, "consumer_heartbeat_interval_ms": 1000, **extra}


@pytest.fixture(scope="module")
def loop(infra: StrataSettings, zoo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    from svc_generator.__main__ import build as build_generator
    from svc_generator.config import GeneratorSettings
    from svc_learner.config import LearnerSettings
    from svc_learner.service import build as build_learner
    from svc_probe.__main__ import build as build_probe
    from svc_probe.config import ProbeSettings
    from svc_reward.__main__ import build as build_reward
    from svc_reward.config import RewardSettings
    from svc_scheduler.__main__ import build_parts as build_scheduler
    from svc_scheduler.settings import SchedulerSettings

    run = uuid.uuid4().hex[:8]
    scheduler = SchedulerSettings(**service_settings(infra, redis_prefix=f"test:train:{run}",
                                                     stats_group_id=f"test-train-stats-{run}"))
    learner = LearnerSettings(**service_settings(
        infra, policy_model_path=zoo.policy, checkpoint_dir=tmp_path_factory.mktemp("checkpoints"),
        group_id=f"test-train-learner-{run}", **LEARNER))
    start_group_at_end(infra.kafka_address, scheduler.stats_group_id, [topics.REWARDS_SCORED])
    start_group_at_end(infra.kafka_address, learner.group_id, [topics.REWARDS_SCORED])
    named: dict[str, ServiceParts] = {
        "scheduler": build_scheduler(scheduler)[0],
        "probe": build_probe(ProbeSettings(**service_settings(infra, model=str(zoo.probe)))),
        "generator": build_generator(GeneratorSettings(**service_settings(infra, tier=1, model=str(zoo.level1)))),
        "generator_l2": build_generator(GeneratorSettings(**service_settings(infra, tier=2, model=str(zoo.level2)))),
        "reward": build_reward(RewardSettings(**service_settings(infra, light_rm=str(zoo.light_rm),
                                                                 strong_rm=str(zoo.strong_rm)))),
        "learner": build_learner(learner),
    }
    running = {name: start_service(parts) for name, parts in named.items()}
    addresses = Addresses(**{name: f"127.0.0.1:{running[name].port}"
                             for name in ("scheduler", "probe", "generator", "learner", "reward")})
    yield {"addresses": addresses, "report_dir": tmp_path_factory.mktemp("reports")}
    for name, parts in named.items():
        stop_service(parts, running[name], grace_s=0)


@pytest.fixture(scope="module")
def summary(infra: StrataSettings, loop: dict) -> TrainSummary:
    options = TrainOptions(updates=UPDATES, prompts_per_round=24, n_samples=2, eval_prompts=48,
                           report_dir=loop["report_dir"], max_rounds=30)
    result = train(infra, options, loop["addresses"])
    print(f"reward {result.reward_change}, oracle {result.oracle_change}")
    return result


def test_the_policy_improves_under_the_light_rm_without_losing_oracle_score(summary: TrainSummary) -> None:
    """Paired over the same held-out prompts and sampling seeds: the reward rises by more than two
    standard errors; the oracle score does not fall by more than two (no significant fall)."""
    assert summary.end_version - summary.start_version >= UPDATES
    reward, oracle = summary.reward_change, summary.oracle_change
    assert reward is not None and oracle is not None
    assert reward.mean > 2 * reward.stderr, f"the light-RM reward did not rise measurably: {reward}"
    assert oracle.mean > -2 * oracle.stderr, f"the oracle score fell: the policy gamed the light RM: {oracle}"
    png = Path(summary.png)
    report = json.loads(png.with_suffix(".json").read_text())
    assert png.is_file() and report["end_version"] == summary.end_version
    assert report["oracle_change"]["n"] == len(summary.before.oracle_scores)


def test_new_weights_reach_the_level1_generator(infra: StrataSettings, loop: dict, summary: TrainSummary) -> None:
    tail = Tail(infra, topics.REWARDS_SCORED)
    try:
        with grpc.insecure_channel(loop["addresses"].scheduler) as channel:
            reply = scheduler_pb2_grpc.SchedulerStub(channel).Submit(scheduler_pb2.SubmitRequest(
                prompt=f"Explain how a compiler turns source code into machine code ({uuid.uuid4().hex[:6]}).",
                n_samples=1), timeout=60)
        events = tail.read(lambda seen: any(e.prompt_hash == reply.prompt_hash and e.tier == common_pb2.TIER_LEVEL_1
                                            for e in seen))
    finally:
        tail.close()
    level1 = [e for e in events if e.prompt_hash == reply.prompt_hash and e.tier == common_pb2.TIER_LEVEL_1]
    assert level1[0].policy_version >= summary.start_version + UPDATES
