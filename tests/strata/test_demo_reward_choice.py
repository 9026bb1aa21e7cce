"""`strata demo --light-rm/--rm-temperature/--escalation-threshold`: passed to svc_reward, or refused before anything
starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from strata.config import StrataSettings
from strata.errors import CliError
from strata_tools.cli import demo_cmd


def test_the_reward_service_gets_the_light_rm_and_temperature_asked_for(tmp_path: Path) -> None:
    args = demo_cmd.reward_service_args(f"{tmp_path}/member-0,{tmp_path}/member-1", 0.3)
    assert args == [*demo_cmd.DEMO_SERVICE_ARGS["reward"], "--light-rm", f"{tmp_path}/member-0,{tmp_path}/member-1",
                    "--temperature", "0.3"]
    assert demo_cmd.reward_service_args(None, None) == demo_cmd.DEMO_SERVICE_ARGS["reward"]


def test_the_reward_service_compares_the_calibrated_raw_threshold_with_raw_scores() -> None:
    assert demo_cmd.reward_service_args(None, None, 2.145) == [
        *demo_cmd.DEMO_SERVICE_ARGS["reward"], "--escalation-threshold", "2.145", "--no-use-calibration"]


@pytest.mark.parametrize(("choice", "named"), [("high", "calibrated, served or a number"), ("nan", "finite")])
def test_a_threshold_that_is_neither_calibrated_served_nor_a_number_is_refused(choice: str, named: str) -> None:
    import argparse

    from strata_tools.rm.escalation import add_threshold_arguments, resolve_threshold

    parser = argparse.ArgumentParser()
    add_threshold_arguments(parser)
    args = parser.parse_args(["--escalation-threshold", choice])
    with pytest.raises(CliError, match=named):
        resolve_threshold(args, None, [], 1.5, 0, print)  # type: ignore[arg-type]
    given = resolve_threshold(parser.parse_args(["--escalation-threshold", "2.5"]), None, [],  # type: ignore[arg-type]
                              1.5, 0, print)
    assert (given.value, given.source) == (2.5, "2.5, given (--escalation-threshold)")


@pytest.mark.parametrize(("light_rm", "temperature", "named"), [
    ("{tmp}/nowhere", None, "nowhere is not a directory"),
    ("{tmp}/rm,", None, "(empty) is not a directory"),
    (None, 0.0, "--rm-temperature must be > 0"),
])
def test_a_choice_that_would_not_take_effect_is_refused(tmp_path: Path, light_rm: str | None,
                                                        temperature: float | None, named: str) -> None:
    (tmp_path / "rm").mkdir()
    settings = StrataSettings(state_dir=tmp_path / "state")
    with pytest.raises(CliError, match=named.replace("(", r"\(").replace(")", r"\)")):
        demo_cmd.check_reward_choice(settings, light_rm.format(tmp=tmp_path) if light_rm else None, temperature)


def test_a_running_stack_keeps_its_reward_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "rm").mkdir()
    settings = StrataSettings(state_dir=tmp_path / "state")
    demo_cmd.check_reward_choice(settings, str(tmp_path / "rm"), 0.3)  # nothing running: accepted
    monkeypatch.setattr(demo_cmd.control, "supervisor_pid", lambda _settings: 4242)
    with pytest.raises(CliError, match="strata down"):
        demo_cmd.check_reward_choice(settings, str(tmp_path / "rm"), None)
    demo_cmd.check_reward_choice(settings, None, None)  # no choice: the running stack is reused as before
