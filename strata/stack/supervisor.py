"""The stack's supervisor process: runs each service as a child, restarts crashes with backoff.

Started detached by ``strata up`` (``python -m strata.stack.supervisor``). State goes to
``<state_dir>/stack.json`` after every change, so ``strata status`` can read it without talking to
this process. SIGTERM stops the stack: every child gets SIGTERM (drain, commit), then SIGKILL after
the grace period.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from strata.stack.spec import ServiceSpec, default_services
from strata.telemetry import setup_logging

log = logging.getLogger("strata.supervisor")

MAX_BACKOFF_S = 60.0
HEALTHY_RUN_S = 60.0  # a child that ran this long has its backoff reset


@dataclass
class ChildState:
    name: str
    port: int
    pid: int | None = None
    state: str = "starting"        # running | backoff | stopped
    restarts: int = 0
    last_exit: int | None = None
    started_at: float = 0.0
    restart_at: float = 0.0
    failures_in_a_row: int = 0


def state_file(state_dir: Path) -> Path:
    return state_dir / "stack.json"


def log_dir(state_dir: Path) -> Path:
    return state_dir / "logs"


class Supervisor:
    def __init__(self, specs: list[ServiceSpec], state_dir: Path, grace_s: float = 30.0) -> None:
        self._specs = {s.name: s for s in specs}
        self._state_dir = state_dir
        self._grace_s = grace_s
        self._children: dict[str, subprocess.Popen] = {}
        self._state = {s.name: ChildState(s.name, s.port) for s in specs}
        self._stopping = False
        log_dir(state_dir).mkdir(parents=True, exist_ok=True)

    def _write_state(self) -> None:
        payload = {"supervisor_pid": os.getpid(), "updated_at": time.time(), "stopping": self._stopping,
                   "services": {name: asdict(st) for name, st in self._state.items()}}
        tmp = state_file(self._state_dir).with_suffix(".tmp")
        tmp.write_text(json.dumps(payload, indent=2))
        tmp.replace(state_file(self._state_dir))

    def _start(self, name: str) -> None:
        spec = self._specs[name]
        out = open(log_dir(self._state_dir) / f"{name}.log", "ab")  # noqa: SIM115 (child owns it)
        proc = subprocess.Popen(spec.argv(sys.executable), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env={**os.environ, **spec.env})
        out.close()
        self._children[name] = proc
        st = self._state[name]
        st.pid, st.state, st.started_at = proc.pid, "running", time.time()
        log.info("started %s (pid %d, port %d)", name, proc.pid, spec.port)

    def _check(self) -> None:
        now = time.time()
        for name, st in self._state.items():
            proc = self._children.get(name)
            if st.state == "running" and proc is not None and (code := proc.poll()) is not None:
                ran = now - st.started_at
                st.failures_in_a_row = 0 if ran > HEALTHY_RUN_S else st.failures_in_a_row + 1
                backoff = min(MAX_BACKOFF_S, 2.0 ** st.failures_in_a_row)
                st.state, st.last_exit, st.pid, st.restart_at = "backoff", code, None, now + backoff
                log.warning("%s exited with code %s after %.0f s; restarting in %.0f s", name, code, ran, backoff)
                self._write_state()
            elif st.state == "backoff" and now >= st.restart_at:
                st.restarts += 1
                self._start(name)
                self._write_state()

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        for name in self._specs:
            self._start(name)
        self._write_state()
        while not self._stopping:
            self._check()
            time.sleep(0.5)
        self._stop_children()
        return 0

    def _on_signal(self, signum: int, _frame: object) -> None:
        log.info("received %s: stopping the stack", signal.Signals(signum).name)
        self._stopping = True

    def _stop_children(self) -> None:
        self._write_state()
        for name, proc in self._children.items():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                log.info("SIGTERM to %s (pid %d)", name, proc.pid)
        deadline = time.monotonic() + self._grace_s
        for name, proc in self._children.items():
            try:
                code = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                log.info("%s stopped (exit %s)", name, code)
            except subprocess.TimeoutExpired:
                proc.kill()
                log.warning("%s did not stop within %.0f s: killed", name, self._grace_s)
                code = proc.wait()
            st = self._state[name]
            st.state, st.pid, st.last_exit = "stopped", None, code
        self._write_state()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m strata.stack.supervisor")
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--only", default="", help="comma-separated service names (default: all)")
    parser.add_argument("--grace-s", type=float, default=30.0)
    parser.add_argument("--service-args", default="{}", help="JSON: service name -> extra argv")
    args = parser.parse_args(argv)
    setup_logging("INFO")
    extra = {k: tuple(v) for k, v in json.loads(args.service_args).items()}
    specs = default_services(extra)
    if args.only:
        wanted = set(args.only.split(","))
        specs = [s for s in specs if s.name in wanted]
    return Supervisor(specs, args.state_dir, args.grace_s).run()


if __name__ == "__main__":
    sys.exit(main())
