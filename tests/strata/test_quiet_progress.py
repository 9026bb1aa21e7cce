"""No third-party progress bars or weight-load reports in non-interactive logs (issue 64): a service's log
file, CI. (Our own bars draw on a pipe at the CLI's pace: tests/strata/test_cli_startup.py.)"""

from __future__ import annotations

import subprocess
import sys

PROGRAM = r'''
from strata.telemetry import setup_logging
setup_logging("INFO")
import logging
from transformers.utils import logging as hf_logging
for _ in hf_logging.tqdm(range(3), desc="Loading weights"):
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
