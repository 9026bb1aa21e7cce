"""`strata rm`'s flags default to their options' defaults: each default lives in the options class only."""

from __future__ import annotations

import argparse
import re

import pytest

from strata_tools.cli import rm_cmd
from strata_tools.rm.light import DistillOptions
from strata_tools.rm.refresh import RefreshOptions
from strata_tools.rm.sources import SourcesOptions
from strata_tools.rm.strong import StrongOptions


def rm_parser(command: str) -> argparse.ArgumentParser:
    commands = argparse.ArgumentParser().add_subparsers()
    rm_cmd.register(commands)
    rm = commands.choices["rm"]
    return next(a for a in rm._actions if isinstance(a, argparse._SubParsersAction)).choices[command]


def help_of(command: str, dest: str) -> str:
    return next(a.help or "" for a in rm_parser(command)._actions if a.dest == dest)


def test_distill_without_flags_runs_the_default_distillation() -> None:
    assert rm_cmd.distill_options(rm_parser("distill").parse_args([])) == DistillOptions()
    assert f"(default {DistillOptions().hold_out:g};" in help_of("distill", "hold_out")


def test_train_strong_without_flags_runs_the_default_strong_rm() -> None:
    assert rm_cmd.strong_options(rm_parser("train-strong").parse_args([])) == StrongOptions()


@pytest.mark.parametrize(("command", "kind"), [("refresh", RefreshOptions), ("sources", SourcesOptions)])
def test_refresh_and_sources_leave_unset_flags_to_their_options_and_show_their_defaults(
    command: str, kind: type[RefreshOptions | SourcesOptions],
) -> None:
    # Unset flags stay None, so that the options read the environment, then their defaults, which the help shows.
    flags = vars(rm_parser(command).parse_args([]))
    options = {name: field.default for name, field in kind.model_fields.items() if name in flags}
    assert options and all(flags[name] is None for name in options)
    shown = {name: match.group(1) for name in options
             if (match := re.search(r"\(default (\d[^,;)]*)", help_of(command, name)))}
    assert len(shown) >= 4
    assert shown == {name: f"{options[name]:g}" for name in shown}
