"""The stack's supervisor process: runs each service as a child, restarts crashes with backoff.

Started detached by ``strata up`` (``python -m strata_tools.stack.supervisor``). State goes to
``<state_dir>/stack.json`` after every change, so ``strata status`` can read it without talking to
this process. SIGTERM stops the stack: every child gets SIGTERM (drain, commit), then SIGKILL after
the grace period.

A child that still runs but no longer answers is restarted too. Every ``health_interval_s`` (10 s)
the supervisor sends each running child a gRPC health check (``grpc.health.v1`` on its port at
``grpc_bind_host``, loopback for 0.0.0.0, through ``strata.rpc.channel`` with its TLS and token),
each bounded by ``health_timeout_s`` (5 s); checks never block the loop (they are gRPC futures);
a child is left alone for ``health_grace_s`` (120 s) after it starts, while it loads its models.
After ``health_failures_to_kill`` (3) failed checks in a row (NOT_SERVING, an error, or no answer)
it gets SIGKILL, with its process group (model workers it started), and the crash path restarts
it; ``hung_kills`` in stack.json counts these. ``--health-interval-s 0`` turns the checks off.

Each child's stdout and stderr are appended to ``<state_dir>/logs/<name>.log``. Every
``log_check_interval_s`` (5 s) a log over ``log_max_bytes`` (50 MiB) is copied to ``<name>.log.1``
(``.1`` moves to ``.2`` and so on; ``log_backups``, 3, are kept) and truncated in place: the child
writes through an O_APPEND descriptor, so it carries on at the new end of the file (copytruncate;
lines written between the copy and the truncation, microseconds apart, are lost). The supervisor's
own ``supervisor.log``, where ``strata up`` sends its output, is rotated the same way.
``--log-max-bytes 0`` turns rotation off.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from strata import rpc
from strata.config import StrataSettings
from strata.telemetry import setup_logging
from strata_tools.stack.spec import ServiceSpec, default_services

log = logging.getLogger("strata.supervisor")

MAX_BACKOFF_S = 60.0
HEALTHY_RUN_S = 60.0  # a child that ran this long has its backoff reset
TICK_S = 0.5          # the main loop's period: exits, restarts, probes and log sizes are looked at this often
SUPERVISOR_LOG = "supervisor.log"  # where `strata up` (control.start) sends this process's output


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
    health_failures: int = 0       # failed health checks in a row of the running process
    hung_kills: int = 0            # times it was killed for failing them


@dataclass
class _Probe:
    """One health check in flight; its channel is closed once the answer (or the deadline) is in."""

    channel: grpc.Channel
    call: grpc.Future
    give_up_at: float              # monotonic; a backstop in case gRPC never resolves the call


def state_file(state_dir: Path) -> Path:
    return state_dir / "stack.json"


def log_dir(state_dir: Path) -> Path:
    return state_dir / "logs"


def rotate_if_larger(path: Path, max_bytes: int, backups: int) -> bool:
    """Copy-truncate ``path`` once it holds more than ``max_bytes``; True when it did.

    ``<path>.1`` is the newest backup, ``<path>.<backups>`` the oldest; the one past it is dropped.
    Truncating in place (instead of renaming) keeps the writer's descriptor valid; it must be O_APPEND,
    or its next write would land at its old offset and leave a hole of NULs in front.
    """
    try:
        if path.stat().st_size <= max_bytes:
            return False
    except FileNotFoundError:
        return False
    if backups > 0:
        for i in range(backups - 1, 0, -1):
            older = path.with_name(f"{path.name}.{i}")
            if older.exists():
                older.replace(path.with_name(f"{path.name}.{i + 1}"))
        with open(path, "rb") as src, open(path.with_name(f"{path.name}.1"), "wb") as dst:
            shutil.copyfileobj(src, dst)
    os.truncate(path, 0)  # right after the copy read to the end: the window for lost lines is tiny
    return True


def _own_log(state_dir: Path) -> Path | None:
    """``logs/supervisor.log`` if it is where this process's stderr goes, opened O_APPEND (safe to truncate)."""
    path = log_dir(state_dir) / SUPERVISOR_LOG
    try:
        ours, on_disk = os.fstat(2), path.stat()
        appends = fcntl.fcntl(2, fcntl.F_GETFL) & os.O_APPEND
    except OSError:
        return None
    same = (ours.st_dev, ours.st_ino) == (on_disk.st_dev, on_disk.st_ino)
    return path if same and appends else None


def _probe_host(settings: StrataSettings) -> str:
    """Where the children listen (``grpc_bind_host``), as a client target; loopback for the wildcards."""
    host = settings.grpc_bind_host
    if host in ("0.0.0.0", "::", "[::]", ""):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc`` and, where it leads its own process group, everything else in that group."""
    if proc.poll() is not None:
        return  # already reaped: its pid may belong to someone else by now
    try:
        if os.getpgid(proc.pid) == proc.pid:
            os.killpg(proc.pid, signal.SIGKILL)
        else:  # it shares a group (with us, maybe): only the child itself
            proc.kill()
    except ProcessLookupError:
        pass


class Supervisor:
    def __init__(
        self, specs: list[ServiceSpec], state_dir: Path, grace_s: float = 30.0, *,
        settings: StrataSettings | None = None,
        health_interval_s: float = 10.0, health_grace_s: float = 120.0, health_timeout_s: float = 5.0,
        health_failures_to_kill: int = 3,
        log_max_bytes: int = 50 * 1024 * 1024, log_backups: int = 3, log_check_interval_s: float = 5.0,
    ) -> None:
        self._specs = {s.name: s for s in specs}
        self._state_dir = state_dir
        self._grace_s = grace_s
        self._settings = settings or StrataSettings()  # the probes' TLS and token (rpc.channel)
        self._probe_host = _probe_host(self._settings)
        self._health_interval_s = health_interval_s
        self._health_grace_s = health_grace_s
        self._health_timeout_s = health_timeout_s
        self._health_failures_to_kill = health_failures_to_kill
        self._log_max_bytes = log_max_bytes
        self._log_backups = log_backups
        self._log_check_interval_s = log_check_interval_s
        self._children: dict[str, subprocess.Popen] = {}
        self._state = {s.name: ChildState(s.name, s.port) for s in specs}
        self._next_probe: dict[str, float] = {}   # name -> monotonic time of its next health check
        self._probes: dict[str, _Probe] = {}      # name -> the check in flight
        self._next_log_check = 0.0
        self._stopping = False
        log_dir(state_dir).mkdir(parents=True, exist_ok=True)
        self._logs = [log_dir(state_dir) / f"{name}.log" for name in self._specs]
        if (own := _own_log(state_dir)) is not None:
            self._logs.append(own)

    def _write_state(self) -> None:
        payload = {"supervisor_pid": os.getpid(), "updated_at": time.time(), "stopping": self._stopping,
                   "services": {name: asdict(st) for name, st in self._state.items()}}
        tmp = state_file(self._state_dir).with_suffix(".tmp")
        tmp.write_text(json.dumps(payload, indent=2))
        tmp.replace(state_file(self._state_dir))

    def _start(self, name: str) -> None:
        spec = self._specs[name]
        out = open(log_dir(self._state_dir) / f"{name}.log", "ab")  # noqa: SIM115 (child owns it)
        # Its own session (and process group): a hung child is killed with the workers it started.
        proc = subprocess.Popen(spec.argv(sys.executable), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env={**os.environ, **spec.env}, start_new_session=True)
        out.close()
        self._children[name] = proc
        st = self._state[name]
        st.pid, st.state, st.started_at, st.health_failures = proc.pid, "running", time.time(), 0
        self._next_probe[name] = time.monotonic() + self._health_grace_s
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

    def _probe(self) -> None:
        """Collect finished health checks and start the due ones; never waits for an answer."""
        if self._health_interval_s <= 0 or self._health_failures_to_kill <= 0:
            return
        now = time.monotonic()
        for name, st in self._state.items():
            probe = self._probes.get(name)
            if probe is not None and st.state != "running":
                self._end_probe(name)  # the process it asked has exited: its answer means nothing now
            elif probe is not None and (probe.call.done() or now >= probe.give_up_at):
                self._record(name, self._end_probe(name))
            elif probe is None and st.state == "running" and now >= self._next_probe.get(name, math.inf):
                self._next_probe[name] = now + self._health_interval_s
                try:
                    channel = rpc.channel(f"{self._probe_host}:{self._specs[name].port}", self._settings)
                except OSError as exc:  # our TLS files, not the child: no reason to kill it
                    log.warning("cannot health-check %s: %s", name, exc)
                    continue
                call = health_pb2_grpc.HealthStub(channel).Check.future(
                    health_pb2.HealthCheckRequest(), timeout=self._health_timeout_s)
                self._probes[name] = _Probe(channel, call, now + self._health_timeout_s + 2 * TICK_S)

    def _end_probe(self, name: str) -> str | None:
        """Close the check's channel; None if the child said SERVING, else what went wrong."""
        probe = self._probes.pop(name)
        try:
            if not probe.call.done():
                probe.call.cancel()
                return f"no answer within {self._health_timeout_s:g} s"
            reply = probe.call.result()
            if reply.status == health_pb2.HealthCheckResponse.SERVING:
                return None
            return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
        except grpc.RpcError as exc:
            if isinstance(exc, grpc.Call):
                return f"{exc.code().name}: {exc.details()}"
            return str(exc) or type(exc).__name__
        except grpc.FutureCancelledError:
            return "check cancelled"
        finally:
            probe.channel.close()

    def _record(self, name: str, failure: str | None) -> None:
        st = self._state[name]
        if failure is None:
            if st.health_failures:
                log.info("%s answers its health check again", name)
                st.health_failures = 0
                self._write_state()
            return
        st.health_failures += 1
        log.warning("%s failed its health check (%d of %d in a row): %s", name, st.health_failures,
                    self._health_failures_to_kill, failure)
        if st.health_failures >= self._health_failures_to_kill:
            proc = self._children[name]
            log.warning("%s (pid %d) is hung: SIGKILL; it restarts like a crashed one", name, proc.pid)
            _kill_tree(proc)
            st.hung_kills += 1
            self._next_probe[name] = math.inf  # no more checks of this process; _start schedules the next one
        self._write_state()

    def _rotate_logs(self) -> None:
        now = time.monotonic()
        if self._log_max_bytes <= 0 or now < self._next_log_check:
            return
        self._next_log_check = now + self._log_check_interval_s
        for path in self._logs:
            try:
                if rotate_if_larger(path, self._log_max_bytes, self._log_backups):
                    log.info("rotated %s (over %d bytes; %d backups kept)", path, self._log_max_bytes,
                             self._log_backups)
            except OSError as exc:  # a full disk must not stop the supervision
                log.warning("could not rotate %s: %s", path, exc)

    def run(self) -> int:
        """Start every child and supervise them until :meth:`stop`; then stop them."""
        for name in self._specs:
            self._start(name)
        self._write_state()
        while not self._stopping:
            self._check()
            self._probe()
            self._rotate_logs()
            time.sleep(TICK_S)
        for name in list(self._probes):
            self._end_probe(name)
        self._stop_children()
        return 0

    def stop(self) -> None:
        """Ask :meth:`run` to stop the stack (from a signal handler or another thread)."""
        self._stopping = True

    def on_signal(self, signum: int, _frame: object) -> None:
        log.info("received %s: stopping the stack", signal.Signals(signum).name)
        self.stop()

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
                _kill_tree(proc)
                log.warning("%s did not stop within %.0f s: killed", name, self._grace_s)
                code = proc.wait()
            st = self._state[name]
            st.state, st.pid, st.last_exit = "stopped", None, code
        self._write_state()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m strata_tools.stack.supervisor")
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--only", default="", help="comma-separated service names (default: all)")
    parser.add_argument("--grace-s", type=float, default=30.0)
    parser.add_argument("--service-args", default="{}", help="JSON: service name -> extra argv")
    parser.add_argument("--health-interval-s", type=float, default=10.0,
                        help="seconds between health checks of a child (0: no checks)")
    parser.add_argument("--health-grace-s", type=float, default=120.0,
                        help="no checks for this long after a child starts (model loading)")
    parser.add_argument("--health-timeout-s", type=float, default=5.0, help="deadline of one health check")
    parser.add_argument("--health-failures-to-kill", type=int, default=3,
                        help="failed checks in a row after which a child is killed and restarted")
    parser.add_argument("--log-max-bytes", type=int, default=50 * 1024 * 1024,
                        help="rotate a log once it is larger (0: never)")
    parser.add_argument("--log-backups", type=int, default=3, help="rotated copies kept per log")
    parser.add_argument("--log-check-interval-s", type=float, default=5.0, help="seconds between log size checks")
    args = parser.parse_args(argv)
    setup_logging("INFO")
    extra = {k: tuple(v) for k, v in json.loads(args.service_args).items()}
    specs = default_services(extra)
    if args.only:
        wanted = set(args.only.split(","))
        specs = [s for s in specs if s.name in wanted]
    log.info("supervising %s: health every %g s (grace %g s, timeout %g s, kill after %d), logs rotated over "
             "%d bytes (%d backups)", ", ".join(s.name for s in specs) or "nothing", args.health_interval_s,
             args.health_grace_s, args.health_timeout_s, args.health_failures_to_kill, args.log_max_bytes,
             args.log_backups)
    supervisor = Supervisor(
        specs, args.state_dir, args.grace_s,
        health_interval_s=args.health_interval_s, health_grace_s=args.health_grace_s,
        health_timeout_s=args.health_timeout_s, health_failures_to_kill=args.health_failures_to_kill,
        log_max_bytes=args.log_max_bytes, log_backups=args.log_backups,
        log_check_interval_s=args.log_check_interval_s,
    )
    signal.signal(signal.SIGTERM, supervisor.on_signal)
    signal.signal(signal.SIGINT, supervisor.on_signal)
    return supervisor.run()


if __name__ == "__main__":
    sys.exit(main())
