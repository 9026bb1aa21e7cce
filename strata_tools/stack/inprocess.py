"""The training stack in one process: scheduler, probe, both generators, reward service and learner,
each started with ``strata.service.start_service`` on a free port over real Kafka and Redis.

What ``strata up`` runs as separate processes, wired as each service's ``__main__`` wires it; for tests
and benches that want the whole loop without the supervisor's fixed ports (``tests/stack/test_train.py``,
``strata bench peers``). ``run_id`` keeps its Redis keys and consumer groups apart from any other stack
on the same Kafka and Redis; its groups start at the end of the rewards topic.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from strata.bus import topics
from strata.bus.admin import start_group_at_end
from strata.config import StrataSettings
from strata.service import start_service, stop_service
from strata_tools.train import Addresses

if TYPE_CHECKING:
    from strata.service import RunningService, ServiceParts
    from strata_tools.zoo.build import ZooPaths

@dataclass(frozen=True)
class StackOverrides:
    """Settings each service gets beyond the infrastructure's and the zoo's (field name -> value)."""

    scheduler: dict[str, Any] = field(default_factory=dict)
    reward: dict[str, Any] = field(default_factory=dict)
    learner: dict[str, Any] = field(default_factory=dict)


def service_settings(infra: StrataSettings, **extra: object) -> dict[str, Any]:
    """What every in-process service shares: the infrastructure, the CPU, a free port, short sessions."""
    return {"kafka_bootstrap": infra.kafka_address, "redis_url": infra.redis_address, "device": "cpu",
            "grpc_port": 0, "consumer_session_timeout_ms": 6000, "consumer_heartbeat_interval_ms": 1000, **extra}


class InProcessStack:
    """Started by :meth:`start`; :meth:`stop` stops every service it started (also after a failed start)."""

    def __init__(self, named: dict[str, ServiceParts]) -> None:
        self._named = named
        self._running: dict[str, RunningService] = {}

    @classmethod
    def start(cls, infra: StrataSettings, zoo: ZooPaths, checkpoint_dir: Path,
              overrides: StackOverrides = StackOverrides(), run_id: str | None = None) -> InProcessStack:
        from svc_generator.__main__ import build as build_generator
        from svc_generator.config import GeneratorSettings
        from svc_learner.config import LearnerSettings
        from svc_learner.service import build as build_learner
        from svc_probe.__main__ import build as build_probe
        from svc_probe.config import ProbeSettings
        from svc_reward.__main__ import build as build_reward
        from svc_reward.config import RewardSettings
        from svc_scheduler.__main__ import build_parts as build_scheduler
        from svc_scheduler.config import SchedulerSettings

        run = run_id or uuid.uuid4().hex[:8]
        scheduler = SchedulerSettings(**service_settings(infra, **{"redis_prefix": f"stack:{run}",
                                                                   "stats_group_id": f"stack-stats-{run}",
                                                                   **overrides.scheduler}))
        learner = LearnerSettings(**service_settings(infra, **{
            "policy_model_path": zoo.policy, "checkpoint_dir": checkpoint_dir, "group_id": f"stack-learner-{run}",
            **overrides.learner}))
        start_group_at_end(infra.kafka_address, scheduler.stats_group_id, [topics.REWARDS_SCORED])
        start_group_at_end(infra.kafka_address, learner.group_id, [topics.REWARDS_SCORED])
        # No desk runs in this stack: Level-2 never waits for one, whatever the environment names (overridable).
        reward = RewardSettings(**service_settings(infra, **{"light_rm": str(zoo.light_rm),
                                                             "strong_rm": str(zoo.strong_rm),
                                                             "await_annotation": False, **overrides.reward}))
        named: dict[str, ServiceParts] = {
            "scheduler": build_scheduler(scheduler)[0],
            "probe": build_probe(ProbeSettings(**service_settings(infra, model=str(zoo.probe)))),
            "generator": build_generator(GeneratorSettings(**service_settings(infra, tier=1, model=str(zoo.level1)))),
            "generator_l2": build_generator(GeneratorSettings(**service_settings(infra, tier=2,
                                                                                 model=str(zoo.level2)))),
            "reward": build_reward(reward),
            "learner": build_learner(learner),
        }
        stack = cls(named)
        try:  # a service that fails to start must not leave the others consuming
            for name, parts in named.items():
                stack._running[name] = start_service(parts)
        except BaseException:
            stack.stop()
            raise
        return stack

    @property
    def addresses(self) -> Addresses:
        return Addresses(**{name: f"127.0.0.1:{self._running[name].port}"
                            for name in ("scheduler", "probe", "generator", "learner", "reward")})

    def stop(self) -> None:
        for name, service in self._running.items():
            stop_service(self._named[name], service, grace_s=0)
        self._running.clear()

    def __enter__(self) -> InProcessStack:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
