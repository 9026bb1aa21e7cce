"""`strata up` (and the demo, which calls it) stops waiting for a service that keeps exiting before it is
healthy, with the service's own last error, instead of waiting out its timeout (strata_tools/stack/control.py
reads the supervisor's count of quick exits in a row from its state file)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from strata.config import StrataSettings
from strata_tools.infra.process import InfraError
from strata_tools.stack import control
from strata_tools.stack.spec import ServiceSpec
from strata_tools.stack.supervisor import log_dir, state_file

LEARNER_LOG = """Traceback (most recent call last):
  File "/work/svc_learner/core.py", line 307, in start
    check_same_lineage(latest, loaded.info.learner_config, learner_config)
ValueError: the latest checkpoint /s/v8 continues the policy /zoo/a/level1, not /zoo/b/level1
"""


def write_state(state_dir: Path, failures: dict[str, int], supervisor: int | None = None) -> None:
    """The supervisor's stack.json as it writes it, with each service's quick exits in a row."""
    services = {name: {"name": name, "failures_in_a_row": n} for name, n in failures.items()}
    state_file(state_dir).write_text(json.dumps({"supervisor_pid": supervisor or os.getpid(), "services": services}))


@pytest.fixture
def waiting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> StrataSettings:
    """A state dir whose supervisor runs (this process stands in) and whose services never answer."""
    settings = StrataSettings(state_dir=tmp_path)
    log_dir(tmp_path).mkdir(parents=True)
    write_state(tmp_path, {"learner": 1, "probe": 0})  # one quick exit so far: not yet a loop
    monkeypatch.setattr(control, "supervisor_pid", lambda s: os.getpid())
    monkeypatch.setattr(control, "health", lambda port: False)
    return settings


def test_a_service_that_keeps_exiting_stops_the_wait_with_its_own_error(waiting: StrataSettings,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    (log_dir(waiting.state_dir) / "learner.log").write_text(LEARNER_LOG)
    counts = iter([{"learner": 1, "probe": 1}, {"learner": 2, "probe": 1}])

    def sleep(seconds: float) -> None:  # each second of the wait, the supervisor records its next restart
        write_state(waiting.state_dir, next(counts, {"learner": 2, "probe": 1}))

    monkeypatch.setattr(control.time, "sleep", sleep)
    services = [ServiceSpec("learner", "svc_learner", 50055, (), ()), ServiceSpec("probe", "svc_probe", 50052, (), ())]
    with pytest.raises(InfraError) as stopped:
        control.start(waiting, services, {}, timeout_s=600, progress=lambda line: None)
    message = str(stopped.value)
    assert message.startswith("learner keeps exiting before it is healthy: ValueError: the latest checkpoint")
    assert "strata logs learner" in message


def test_one_exit_another_supervisors_state_or_a_service_not_waited_for_do_not_count(tmp_path: Path) -> None:
    path = state_file(tmp_path)
    write_state(tmp_path, {"learner": 2, "reward": 3})
    assert control.crash_looping(path, os.getpid(), {"learner"}) == ["learner"]
    assert control.crash_looping(path, os.getpid(), {"probe"}) == []  # reward loops but is not waited for
    assert control.crash_looping(path, os.getpid() + 1, {"learner"}) == []  # left by another supervisor
    write_state(tmp_path, {"learner": 1})
    assert control.crash_looping(path, os.getpid(), {"learner"}) == []  # one exit since it last ran a while
    assert control.crash_looping(tmp_path / "absent.json", os.getpid(), {"learner"}) == []
