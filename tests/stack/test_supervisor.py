"""The supervisor against real child processes: hung children are killed and restarted, logs rotate.

The children run ``supervised_child`` (beside this file), a gRPC health server that can be told
to hang; the supervisor runs in a thread of the test process (its loop is the same as under
``strata up``), except in the last test, which starts ``python -m strata_tools.stack.supervisor`` the
way ``strata up`` does.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from strata_tools.infra.process import free_port, start_detached, stop_pid
from strata_tools.stack.control import health
from strata_tools.stack.spec import ServiceSpec
from strata_tools.stack.supervisor import Supervisor, log_dir, state_file

HERE = Path(__file__).parent
DEADLINE_S = 30.0
# Fast probing for tests: a check every 0.2 s (the loop's 0.5 s tick, in effect) after a 3 s
# start-up grace (a child serves after about 1 s on an idle machine), killed after 3 failures.
FAST_HEALTH = {"health_interval_s": 0.2, "health_grace_s": 3.0, "health_timeout_s": 0.2,
               "health_failures_to_kill": 3}


HANDED_OUT: set[int] = set()  # ports given to children that may not have bound them yet


def child(name: str, *args: str) -> ServiceSpec:
    path = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    port = free_port(avoid=HANDED_OUT)
    HANDED_OUT.add(port)
    return ServiceSpec(name, "supervised_child", port, args, env={"PYTHONPATH": path})


def wait_for(check: Callable[[], Any], what: str, timeout_s: float = DEADLINE_S) -> Any:
    """Poll ``check`` until it returns something truthy (returned); fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not (result := check()):
        assert time.monotonic() < deadline, f"not within {timeout_s:.0f} s: {what}"
        time.sleep(0.05)
    return result


def services(state_dir: Path) -> dict[str, dict[str, Any]]:
    return json.loads(state_file(state_dir).read_text())["services"]


@contextmanager
def supervising(specs: list[ServiceSpec], state_dir: Path, **kwargs: Any) -> Iterator[Supervisor]:
    supervisor = Supervisor(specs, state_dir, grace_s=5.0, **kwargs)
    thread = threading.Thread(target=supervisor.run, name="supervisor", daemon=True)
    thread.start()
    try:
        wait_for(lambda: state_file(state_dir).exists(), "the first stack.json")
        yield supervisor
    finally:
        supervisor.stop()
        thread.join(timeout=DEADLINE_S)
        assert not thread.is_alive(), "the supervisor did not stop its children"


def seqs(path: Path) -> list[int]:
    return [int(n) for n in re.findall(rb"^line (\d+) ", path.read_bytes(), re.MULTILINE)]


def test_hung_children_are_killed_and_restarted_while_a_healthy_one_runs_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="strata.supervisor")
    hang_file = tmp_path / "hang"
    # One hangs by saying NOT_SERVING, one by not answering at all, one stays healthy.
    refusing, frozen, steady = child("refusing", "--hang-file", str(hang_file)), child("frozen"), child("steady")
    with supervising([refusing, frozen, steady], tmp_path, **FAST_HEALTH):
        wait_for(lambda: all(health(s.port) for s in (refusing, frozen, steady)), "every child serving")
        before = services(tmp_path)
        hang_file.write_text(str(before["refusing"]["pid"]))  # its restarted successor has another pid
        os.kill(before["frozen"]["pid"], signal.SIGSTOP)       # the port accepts connections, nothing answers

        def restarted(name: str) -> bool:
            st = services(tmp_path)[name]
            return st["state"] == "running" and st["pid"] not in (None, before[name]["pid"])

        wait_for(lambda: restarted("refusing") and restarted("frozen"), "both hung children restarted")
        wait_for(lambda: health(refusing.port) and health(frozen.port), "the restarted children serving")
        after = services(tmp_path)

    for name in ("refusing", "frozen"):
        assert (after[name]["hung_kills"], after[name]["restarts"], after[name]["last_exit"]) == (1, 1, -9), name
    # Over the same period the healthy child was checked as often and never touched.
    assert after["steady"]["pid"] == before["steady"]["pid"]
    assert (after["steady"]["hung_kills"], after["steady"]["restarts"], after["steady"]["health_failures"]) == (0, 0, 0)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for name, reason in [("refusing", "NOT_SERVING"), ("frozen", "DEADLINE_EXCEEDED")]:
        assert any(m.startswith(f"{name} failed its health check (3 of 3") and reason in m for m in warnings), warnings
        assert any(m.startswith(f"{name} (pid") and "is hung" in m for m in warnings), warnings
    assert not any(m.startswith("steady") for m in warnings), warnings


def test_a_log_over_the_limit_is_rotated_and_the_child_keeps_writing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="strata.supervisor")
    chatty = child("chatty", "--chatter-bytes-per-s", "40000")
    live = log_dir(tmp_path) / "chatty.log"
    with supervising([chatty], tmp_path, health_interval_s=0, log_max_bytes=10_000, log_backups=2,
                     log_check_interval_s=0.2):
        # Four rotations: the first backup has been shifted to .2 and then dropped.
        wait_for(lambda: sum("rotated" in r.getMessage() for r in caplog.records) >= 4, "four rotations")
    # The child wrote its last line after the supervisor's last rotation; the files are still now.
    backups = [live.with_name(f"chatty.log.{i}") for i in (2, 1)]
    assert all(p.exists() for p in backups)
    assert not live.with_name("chatty.log.3").exists()
    for path in [*backups, live]:
        assert b"\0" not in path.read_bytes(), f"{path.name}: a hole, the child did not append"
    assert all(p.stat().st_size > 10_000 for p in backups)
    # Oldest to newest: .2, .1, then the live file, which went on from where .1 ended.
    older, newer, current = (seqs(p) for p in [*backups, live])
    assert older and newer and current
    assert max(older) < min(newer) and max(newer) < min(current)
    assert live.read_bytes().endswith(b"stopped\n")


def test_the_supervisor_rotates_its_own_log_as_strata_up_starts_it(tmp_path: Path) -> None:
    own = log_dir(tmp_path) / "supervisor.log"
    argv = [sys.executable, "-m", "strata_tools.stack.supervisor", "--state-dir", str(tmp_path), "--only", "none",
            "--log-max-bytes", "100", "--log-check-interval-s", "0.1"]
    pid = start_detached(argv, own, tmp_path / "supervisor.pid")
    try:
        # Its first line, the settings it runs with, is over 100 bytes.
        wait_for(lambda: own.with_name("supervisor.log.1").exists(), "supervisor.log.1")
    finally:
        assert stop_pid(pid, timeout_s=DEADLINE_S), "the supervisor did not stop on SIGTERM"
    assert b"supervising nothing" in own.with_name("supervisor.log.1").read_bytes()
    text = own.read_bytes()
    assert b"\0" not in text and b"received SIGTERM" in text
