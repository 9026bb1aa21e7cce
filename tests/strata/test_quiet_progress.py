"""No progress bars or weight-load reports in non-interactive logs (issue 64): a service's log file, CI."""

from __future__ import annotations

import subprocess
import sys

PROGRAM = r'''
from strata.telemetry import setup_logging
setup_logging("INFO")
import logging
from tqdm import tqdm
for _ in tqdm(range(3), desc="Loading weights"):
    pass
logging.getLogger("transformers.utils.loading_report").warning("GPT2 LOAD REPORT: unexpected keys")
logging.getLogger("transformers.utils.loading_report").error("a weight could not be loaded")
logging.getLogger("svc_test").info("service line")
'''


def test_a_piped_process_logs_its_lines_without_bars_or_load_reports() -> None:
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=60, check=True,
                          env={"PATH": "/usr/bin:/bin"})
    assert "service line" in done.stderr
    assert "a weight could not be loaded" in done.stderr  # errors still reach the log
    assert "Loading weights" not in done.stderr and "LOAD REPORT" not in done.stderr


def test_our_own_bars_stay_off_a_log_whatever_was_imported_first() -> None:
    """The CLI imports tqdm before it sets up logging, so the environment switch cannot reach our bars:
    every bar of ours asks tqdm to judge the terminal itself (``disable=None``)."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[2]
    calls = []
    for package in ("strata", "strata_tools", "svc_generator", "svc_learner", "svc_probe", "svc_reward",
                    "svc_scheduler", "svc_annotation"):
        for path in (root / package).rglob("*.py"):
            text = path.read_text()
            for found in re.finditer(r"\btqdm\((?:[^()]|\([^()]*\))*\)", text):
                calls.append((path.name, found.group(0)))
    assert calls, "no tqdm call found: the check is reading the wrong tree"
    assert [c for c in calls if "disable=" not in c[1]] == []
