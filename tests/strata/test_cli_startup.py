"""`strata <command>` imports only that command's module: a container's healthcheck (`strata
health`) must answer within its timeout, without the seconds torch and transformers take."""

from __future__ import annotations

import io
import subprocess
import sys

from tqdm import tqdm

from strata_tools.cli.main import COMMAND_MODULES, MODULE_OF_COMMAND, build_parser


def test_health_loads_no_model_library() -> None:
    code = ("import sys; from strata_tools.cli.main import main; "
            "rc = main(['health', '127.0.0.1:1', '--timeout', '0.2']); "
            "print(rc, sorted(m for m in ('torch', 'transformers', 'faiss') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    last = done.stdout.strip().splitlines()[-1]
    assert last == "1 []", done.stdout + done.stderr  # exit 1: nothing serves on port 1; no model library


def test_every_command_maps_to_the_module_that_registers_it() -> None:
    assert set(MODULE_OF_COMMAND.values()) == set(COMMAND_MODULES)
    full = build_parser()
    commands = next(a for a in full._actions if a.dest == "command").choices
    assert set(commands) == set(MODULE_OF_COMMAND)
    for command, module in MODULE_OF_COMMAND.items():
        only = next(a for a in build_parser([command])._actions if a.dest == "command").choices
        assert command in only, (command, module)


def test_progress_bars_written_to_a_pipe_draw_at_most_every_30_seconds() -> None:
    code = ("import strata_tools.cli, sys, time; from tqdm import tqdm\n"
            "for _ in tqdm(range(50)): time.sleep(0.01)")
    piped = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert len(piped.stderr.split("\r")) <= 3, piped.stderr  # the first draw, the last, and no tick between
    assert "50/50" in piped.stderr


def test_a_round_redraw_keeps_the_bars_pace() -> None:
    from strata_tools.cli.progress import redraw

    log = io.StringIO()
    bar = tqdm(total=8, file=log, mininterval=30)  # as on a pipe
    for round_ in range(20):  # the demo's rounds: the count rarely moves, the figures do
        bar.n = round_ // 5
        bar.set_postfix_str(f"round {round_}", refresh=False)
        redraw(bar)
    assert len(log.getvalue().split("\r")) <= 2, log.getvalue()  # the first draw only
    bar.mininterval = 0  # as on a terminal: every round shows
    redraw(bar)
    assert log.getvalue().endswith("round 19]")


def test_a_disabled_bar_is_left_alone() -> None:
    """A process started under TQDM_DISABLE (a service or tool whose parent writes to a log) gets disabled
    bars; redrawing one draws nothing rather than failing."""
    from strata_tools.cli.progress import redraw

    log = io.StringIO()
    bar = tqdm(total=8, file=log, disable=True)
    bar.set_postfix_str("round 1", refresh=False)
    redraw(bar)
    assert log.getvalue() == ""
