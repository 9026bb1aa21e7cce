"""The training stack as one process per service, as ``strata up`` and compose run it, for benches that time it.

The services and their settings are :func:`~strata_tools.stack.inprocess.plan_stack`'s, the in-process
stack's: each runs as ``python -m <module>`` with the settings the stack gives it in its environment
(``STRATA_<FIELD>``) and a gRPC port of its own. Apart, the services share no interpreter lock: in one
process, six services' Python (Kafka clients, the generator's sampling loop, the learner's optimiser) take
turns on one lock and a PPO update beside generation runs slower than on a core of its own.

``threads`` is each service's torch (OpenMP) thread count. On a CPU shared by the services it is a
budget, not a preference: processes with more threads than their share of the cores spin in each other's
barriers (docs/performance.md, *Threads on a shared CPU*).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from strata.config import env_name
from strata_tools.infra.process import cpu_seconds, free_port, peak_rss_bytes, tail
from strata_tools.stack.control import health
from strata_tools.stack.inprocess import ServicePlan, StackOverrides, plan_stack
from strata_tools.stack.spec import THREAD_VARIABLES
from strata_tools.train import Addresses

if TYPE_CHECKING:
    from strata.config import StrataSettings
    from strata_tools.zoo.build import ZooPaths


class StackStartError(RuntimeError):
    """A service process exited or never answered its health check; the message holds its log's tail."""


def settings_env(plan: ServicePlan) -> dict[str, str]:
    """The fields the stack set, as the environment variables the service reads them from."""
    values = plan.settings.model_dump(mode="json", include=set(plan.given))
    env = {}
    for name in sorted(plan.given):
        value = values[name]
        if value is None:
            if type(plan.settings).model_fields[name].default is not None:
                raise ValueError(f"{plan.module}: {name}=None cannot be passed through the environment")
            continue
        env[env_name(name)] = value if isinstance(value, str) else json.dumps(value)
    return env


def service_env(plan: ServicePlan, port: int, threads: int) -> dict[str, str]:
    """The service process's environment: this one's, the plan's settings, its port and its threads."""
    return {**os.environ, **settings_env(plan), "STRATA_GRPC_PORT": str(port),
            **{variable: str(threads) for variable in THREAD_VARIABLES}}


class ProcessStack:
    """Started by :meth:`start`; :meth:`stop` stops every process it started (also after a failed start)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self._processes: dict[str, subprocess.Popen[bytes]] = {}
        self._ports: dict[str, int] = {}

    @classmethod
    def start(cls, infra: StrataSettings, zoo: ZooPaths, checkpoint_dir: Path, log_dir: Path,
              overrides: StackOverrides | None = None, run_id: str | None = None, threads: int = 1,
              ready_timeout_s: float = 600.0) -> ProcessStack:
        """Start every service (``threads`` torch threads each, logs in ``log_dir/<name>.log``) and wait until
        each answers its health check."""
        if threads < 1:
            raise ValueError("threads must be >= 1")
        log_dir.mkdir(parents=True, exist_ok=True)
        stack = cls(log_dir)
        try:
            for name, plan in plan_stack(infra, zoo, checkpoint_dir, overrides or StackOverrides(), run_id).items():
                port = free_port(avoid=stack._ports.values())  # handed out, maybe not bound yet
                with (log_dir / f"{name}.log").open("wb") as log:
                    stack._processes[name] = subprocess.Popen(
                        [sys.executable, "-m", plan.module], stdout=log, stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL, env=service_env(plan, port, threads), start_new_session=True)
                stack._ports[name] = port
            stack._wait_ready(ready_timeout_s)
        except BaseException:
            stack.stop()
            raise
        return stack

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        waiting = dict(self._ports)
        while waiting:
            for name, port in list(waiting.items()):
                code = self._processes[name].poll()
                if code is not None:
                    log = self.log_dir / f"{name}.log"
                    raise StackStartError(f"{name} exited with status {code} while starting; the end of its log "
                                          f"({log}):\n{tail(log, 30)}")
                if health(port):
                    del waiting[name]
            if waiting and time.monotonic() > deadline:
                names = ", ".join(sorted(waiting))
                raise StackStartError(f"{names} not serving after {timeout_s:.0f} s; logs in {self.log_dir}")
            if waiting:
                time.sleep(0.5)  # polling the health check: a starting process announces nothing else

    @property
    def addresses(self) -> Addresses:
        return Addresses(**{name: f"127.0.0.1:{self._ports[name]}"
                            for name in ("scheduler", "probe", "generator", "learner", "reward")})

    def peak_rss_mb(self) -> float:
        """The services' peak resident memory, summed (read before they stop): the libraries and model files
        they share are counted in each, so this bounds their memory from above."""
        return sum(peak_rss_bytes(process.pid) for process in self._processes.values()) / 2**20

    def cpu_seconds(self) -> dict[str, float]:
        """Each service's CPU seconds so far."""
        return {name: cpu_seconds(process.pid) for name, process in self._processes.items()}

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM every service (each drains and commits), then SIGKILL what is left after ``grace_s``."""
        for process in self._processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for process in self._processes.values():
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._processes.clear()

    def __enter__(self) -> ProcessStack:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
