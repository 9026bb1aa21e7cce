"""`strata demo --light-rm/--rm-temperature`: passed to svc_reward, or refused before anything starts."""

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
