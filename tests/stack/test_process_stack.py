"""The stack as one process per service (``strata_tools.stack.processes``): the same plan as the in-process
stack, passed through each service's environment, and a service that cannot start reported with its log."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from strata.config import StrataSettings
from strata_tools.stack.inprocess import StackOverrides, plan_stack
from strata_tools.stack.processes import ProcessStack, StackStartError, service_env, settings_env
from strata_tools.zoo.build import ZooPaths
from svc_generator.config import GeneratorSettings
from svc_learner.config import LearnerSettings
from svc_reward.config import RewardSettings
from svc_scheduler.config import SchedulerSettings

pytestmark = pytest.mark.integration  # plan_stack positions the run's consumer groups on Kafka


def _read_back(settings_type: type, env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> object:
    for name in [n for n in os.environ if n.startswith("STRATA_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return settings_type()


def test_every_service_reads_back_the_settings_the_plan_gave_it(
    zoo: ZooPaths, infra: StrataSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    overrides = StackOverrides(scheduler={"tiering": False},
                               reward={"escalation_threshold": -1.0, "annotate_level2": False},
                               learner={"batch_size": 8, "train_tiers": "1", "kl_coef": 0.2})
    plans = plan_stack(infra, zoo, tmp_path / "checkpoints", overrides, run_id="t1")
    assert list(plans) == ["scheduler", "probe", "generator", "generator_l2", "reward", "learner"]
    types = {"scheduler": SchedulerSettings, "generator": GeneratorSettings, "generator_l2": GeneratorSettings,
             "reward": RewardSettings, "learner": LearnerSettings}
    for name, settings_type in types.items():
        plan = plans[name]
        read = _read_back(settings_type, settings_env(plan), monkeypatch)
        for field in plan.given:  # what the service process will run with is what the plan built
            assert getattr(read, field) == getattr(plan.settings, field), (name, field)
    learner = _read_back(LearnerSettings, settings_env(plans["learner"]), monkeypatch)
    assert (learner.batch_size, learner.train_tiers, learner.group_id) == (8, "1", "stack-learner-t1")
    assert _read_back(GeneratorSettings, settings_env(plans["generator_l2"]), monkeypatch).tier == 2

    env = service_env(plans["learner"], 6123, threads=1)
    assert (env["STRATA_GRPC_PORT"], env["OMP_NUM_THREADS"], env["MKL_NUM_THREADS"]) == ("6123", "1", "1")


def test_a_none_that_the_environment_cannot_say_is_refused(
    zoo: ZooPaths, infra: StrataSettings, tmp_path: Path,
) -> None:
    plan = plan_stack(infra, zoo, tmp_path / "checkpoints", run_id="t2")["generator"]
    # tier has a default (1); the environment has no way to say "None" instead of it.
    odd = dataclasses.replace(plan, settings=plan.settings.model_copy(update={"tier": None}),
                              given=plan.given | {"tier"})
    with pytest.raises(ValueError, match="tier=None"):
        settings_env(odd)


def test_a_service_that_cannot_start_is_named_with_its_log_and_nothing_is_left_running(
    zoo: ZooPaths, infra: StrataSettings, tmp_path: Path,
) -> None:
    broken = dataclasses.replace(zoo, level2=tmp_path / "no-such-model")  # read by generator_l2 only
    with pytest.raises(StackStartError, match=r"(?s)generator_l2 exited with status \d+ while starting.*no-such-model"):
        ProcessStack.start(infra, broken, tmp_path / "checkpoints", tmp_path / "logs", run_id="t3",
                           ready_timeout_s=300)
    logs = sorted(p.name for p in (tmp_path / "logs").iterdir())
    assert "generator_l2.log" in logs
    leftover = [p.name for p in Path("/proc").iterdir() if p.name.isdigit() and _runs_from(p, tmp_path)]
    assert not leftover, "a service process outlived the failed start"


def _runs_from(proc: Path, tmp_path: Path) -> bool:
    """Whether a process writes to a file under this test's directory (each service writes its log there)."""
    try:
        return any(os.readlink(fd).startswith(str(tmp_path)) for fd in (proc / "fd").iterdir())
    except OSError:
        return False
