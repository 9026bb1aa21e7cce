"""What the local stack runs: one entry per service process."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
# The services whose torch work can all run at once: the learner, both generators and the reward service
# (the probe and the scheduler's encoder answer in short bursts).
BUSY_TORCH_SERVICES = 4


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


def cores_here() -> int:
    """The cores this process may run on (its CPU affinity: a cgroup's cpuset or taskset narrows it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def thread_env(environ: Mapping[str, str], cores: int) -> dict[str, str]:
    """Each service's torch (OpenMP) threads, unless the environment sets them: the cores shared among the
    services that work at once, at least one each. torch's own default, every core in every process, makes
    the processes' thread teams spin against each other (docs/performance.md, *Threads on a shared CPU*)."""
    if any(name in environ for name in THREAD_VARIABLES):
        return {}
    threads = max(1, cores // BUSY_TORCH_SERVICES)
    return {name: str(threads) for name in THREAD_VARIABLES}


def default_services(extra_args: dict[str, tuple[str, ...]] | None = None,
                     environ: Mapping[str, str] | None = None, cores: int | None = None) -> list[ServiceSpec]:
    """Scheduler, probe, generator Level-1 and Level-2, reward, learner and annotation, each on its own port,
    with :func:`thread_env`'s threads (from ``environ`` and ``cores``: by default this process's)."""
    extra = extra_args or {}
    threads = thread_env(os.environ if environ is None else environ, cores or cores_here())
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
    return [ServiceSpec(s.name, s.module, s.port, s.args + extra.get(s.name, ()), s.consumer_groups,
                        {**threads, **s.env}) for s in specs]
