"""`strata up` (and the demo, which calls it) stops waiting for a service that keeps exiting before it is
healthy, with the service's own last error, instead of waiting out its timeout (strata_tools/stack/control.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from strata.config import StrataSettings
from strata_tools.infra.process import InfraError
from strata_tools.stack import control
from strata_tools.stack.spec import ServiceSpec
from strata_tools.stack.supervisor import log_dir

LEARNER_LOG = """Traceback (most recent call last):
  File "/work/svc_learner/core.py", line 307, in start
    check_same_lineage(latest, loaded.info.learner_config, learner_config)
ValueError: the latest checkpoint /s/v8 continues the policy /zoo/a/level1, not /zoo/b/level1
"""


def exit_line(name: str, code: int = 1) -> str:
    return (f"2026-12-06 23:20:28,850 WARNING strata.supervisor: {name} exited with code {code} after 6 s; "
            "restarting in 60 s\n")


@pytest.fixture
def waiting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> StrataSettings:
    """A state dir whose supervisor runs (this process stands in) and whose services never answer."""
    settings = StrataSettings(state_dir=tmp_path)
    log_dir(tmp_path).mkdir(parents=True)
    (log_dir(tmp_path) / "supervisor.log").write_text(exit_line("learner"))  # an exit before this wait began
    monkeypatch.setattr(control, "supervisor_pid", lambda s: os.getpid())
    monkeypatch.setattr(control, "health", lambda port: False)
    return settings


def test_a_service_that_keeps_exiting_stops_the_wait_with_its_own_error(waiting: StrataSettings,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    (log_dir(waiting.state_dir) / "learner.log").write_text(LEARNER_LOG)
    exits = iter([exit_line("learner"), exit_line("probe"), exit_line("learner")])

    def sleep(seconds: float) -> None:  # each second of the wait, the supervisor logs its next restart
        with open(log_dir(waiting.state_dir) / "supervisor.log", "a") as log:
            log.write(next(exits, ""))

    monkeypatch.setattr(control.time, "sleep", sleep)
    services = [ServiceSpec("learner", "svc_learner", 50055, (), ()), ServiceSpec("probe", "svc_probe", 50052, (), ())]
    with pytest.raises(InfraError) as stopped:
        control.start(waiting, services, {}, timeout_s=600, progress=lambda line: None)
    message = str(stopped.value)
    assert message.startswith("learner keeps exiting before it is healthy: ValueError: the latest checkpoint")
    assert "strata logs learner" in message


def test_exits_before_the_wait_or_of_healthy_services_do_not_count(tmp_path: Path) -> None:
    log = tmp_path / "supervisor.log"
    log.write_text(exit_line("learner") + exit_line("learner"))
    offset = log.stat().st_size
    with open(log, "a") as out:
        out.write(exit_line("learner") + exit_line("reward") + exit_line("reward"))
    assert control.crash_looping(log, 0, {"learner"}) == ["learner"]
    assert control.crash_looping(log, offset, {"learner"}) == []  # one exit since the wait began
    assert control.crash_looping(log, offset, {"learner", "probe"}) == []  # reward is not waited for
    assert control.crash_looping(tmp_path / "absent.log", 0, {"learner"}) == []
