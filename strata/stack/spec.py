"""What the local stack runs: one entry per service process."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ServiceSpec:
    name: str                          # also the log file name
    module: str                        # python -m <module>
    port: int                          # gRPC port (health checks go here)
    args: tuple[str, ...] = ()
    consumer_groups: tuple[str, ...] = ()   # for the consumer-lag column
    env: dict[str, str] = field(default_factory=dict)

    def argv(self, python: str) -> list[str]:
        return [python, "-m", self.module, "--grpc-port", str(self.port), *self.args]


def default_services(extra_args: dict[str, tuple[str, ...]] | None = None) -> list[ServiceSpec]:
    """Scheduler, probe, generator Level-1 and Level-2, reward and learner, each on its own port."""
    extra = extra_args or {}
    specs = [
        ServiceSpec("scheduler", "svc_scheduler", 50051, consumer_groups=("svc-scheduler-stats",)),
        ServiceSpec("probe", "svc_probe", 50052, consumer_groups=("svc-probe",)),
        ServiceSpec("generator-l1", "svc_generator", 50053, ("--tier", "1"), ("svc-generator-l1",)),
        ServiceSpec("generator-l2", "svc_generator", 50054, ("--tier", "2"), ("svc-generator-l2",)),
        ServiceSpec("reward", "svc_reward", 50056, consumer_groups=("svc-reward",)),
        ServiceSpec("learner", "svc_learner", 50055, consumer_groups=("svc-learner",)),
    ]
    return [ServiceSpec(s.name, s.module, s.port, s.args + extra.get(s.name, ()), s.consumer_groups, s.env)
            for s in specs]
