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
    """Scheduler, probe, generator Level-1 and Level-2, reward, learner and annotation, each on its own port."""
    extra = extra_args or {}
    # Prometheus endpoints on 9151-9156 and 9158 (9157 is strata-exporter's), as in compose.yaml (the
    # diagnostics' defaults).
    specs = [
        ServiceSpec("scheduler", "svc_scheduler", 50051, ("--metrics-port", "9151"), ("svc-scheduler-stats",)),
        ServiceSpec("probe", "svc_probe", 50052, ("--metrics-port", "9152"), ("svc-probe",)),
        ServiceSpec("generator-l1", "svc_generator", 50053, ("--tier", "1", "--metrics-port", "9153"),
                    ("svc-generator-l1",)),
        ServiceSpec("generator-l2", "svc_generator", 50054, ("--tier", "2", "--metrics-port", "9154"),
                    ("svc-generator-l2",)),
        ServiceSpec("reward", "svc_reward", 50056, ("--metrics-port", "9156"), ("svc-reward",)),
        ServiceSpec("learner", "svc_learner", 50055, ("--metrics-port", "9155"), ("svc-learner",)),
        ServiceSpec("annotation", "svc_annotation", 50057, ("--metrics-port", "9158"), ("svc-annotation",)),
    ]
    return [ServiceSpec(s.name, s.module, s.port, s.args + extra.get(s.name, ()), s.consumer_groups, s.env)
            for s in specs]
