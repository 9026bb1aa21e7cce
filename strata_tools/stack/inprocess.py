"""The training stack in one process: scheduler, probe, both generators, reward service and learner,
each started with ``strata.service.start_service`` on a free port over real Kafka and Redis.

What ``strata up`` runs as separate processes, wired as each service's ``__main__`` wires it; for tests
that want the whole loop without the supervisor's fixed ports (``tests/stack/test_train.py``) and for
``strata bench peers --stack threads``. :func:`plan_stack` is the one definition of what each service
runs with, shared with the process stack (``strata_tools.stack.processes``), which the benches time.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic_settings import BaseSettings

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


@dataclass(frozen=True)
class ServicePlan:
    """One service of the stack: what runs it and the settings it runs with."""

    module: str  # python -m <module>
    settings: BaseSettings
    given: frozenset[str]  # its fields the stack set (the rest come from the environment and defaults)


def plan_stack(infra: StrataSettings, zoo: ZooPaths, checkpoint_dir: Path,
               overrides: StackOverrides = StackOverrides(), run_id: str | None = None) -> dict[str, ServicePlan]:
    """Every service's settings, in start order; one definition for the in-process and the process stack.

    ``run_id`` keeps the run's Redis keys and consumer groups apart from any other stack on the same Kafka
    and Redis; the scheduler's stats group and the learner's group start at the end of the rewards topic.
    """
    from svc_generator.config import GeneratorSettings
    from svc_learner.config import LearnerSettings
    from svc_probe.config import ProbeSettings
    from svc_reward.config import RewardSettings
    from svc_scheduler.config import SchedulerSettings

    run = run_id or uuid.uuid4().hex[:8]
    given: dict[str, tuple[str, type[BaseSettings], dict[str, Any]]] = {
        "scheduler": ("svc_scheduler", SchedulerSettings, service_settings(infra, **{
            "redis_prefix": f"stack:{run}", "stats_group_id": f"stack-stats-{run}", **overrides.scheduler})),
        "probe": ("svc_probe", ProbeSettings, service_settings(infra, model=str(zoo.probe))),
        "generator": ("svc_generator", GeneratorSettings, service_settings(infra, tier=1, model=str(zoo.level1))),
        "generator_l2": ("svc_generator", GeneratorSettings, service_settings(infra, tier=2, model=str(zoo.level2))),
        # No desk runs in this stack: Level-2 never waits for one, whatever the environment names (overridable).
        "reward": ("svc_reward", RewardSettings, service_settings(infra, **{
            "light_rm": str(zoo.light_rm), "strong_rm": str(zoo.strong_rm), "await_annotation": False,
            **overrides.reward})),
        "learner": ("svc_learner", LearnerSettings, service_settings(infra, **{
            "policy_model_path": zoo.policy, "checkpoint_dir": checkpoint_dir, "group_id": f"stack-learner-{run}",
            **overrides.learner})),
    }
    # service_settings' shared fields that a service does not have are ignored by it, as in-process.
    plans = {name: ServicePlan(module, settings_type(**values), frozenset(values) & set(settings_type.model_fields))
             for name, (module, settings_type, values) in given.items()}
    for name, group_field in (("scheduler", "stats_group_id"), ("learner", "group_id")):
        start_group_at_end(infra.kafka_address, given[name][2][group_field], [topics.REWARDS_SCORED])
    return plans


class InProcessStack:
    """Started by :meth:`start`; :meth:`stop` stops every service it started (also after a failed start)."""

    def __init__(self, named: dict[str, ServiceParts]) -> None:
        self._named = named
        self._running: dict[str, RunningService] = {}

    @classmethod
    def start(cls, infra: StrataSettings, zoo: ZooPaths, checkpoint_dir: Path,
              overrides: StackOverrides = StackOverrides(), run_id: str | None = None) -> InProcessStack:
        from svc_generator.__main__ import build as build_generator
        from svc_learner.service import build as build_learner
        from svc_probe.__main__ import build as build_probe
        from svc_reward.__main__ import build as build_reward
        from svc_scheduler.__main__ import build_parts as build_scheduler

        plans = plan_stack(infra, zoo, checkpoint_dir, overrides, run_id)
        builders: dict[str, Callable[[Any], ServiceParts]] = {
            "scheduler": lambda settings: build_scheduler(settings)[0], "probe": build_probe,
            "generator": build_generator, "generator_l2": build_generator, "reward": build_reward,
            "learner": build_learner,
        }
        named = {name: builders[name](plan.settings) for name, plan in plans.items()}
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
