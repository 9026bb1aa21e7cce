"""``python -m svc_learner --policy-model-path DIR``: the PPO learner service (R13, R17)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from transformers.utils import logging as hf_logging

from strata.config import add_settings_flags, parse_settings
from strata.service import run_service
from strata.telemetry import setup_logging
from svc_learner.config import LearnerSettings
from svc_learner.service import LearnerSetupError, build


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m svc_learner", description=__doc__)
    add_settings_flags(parser, LearnerSettings)
    settings, _args = parse_settings(parser, LearnerSettings, argv)
    setup_logging(settings.log_level, debug_rollout=settings.debug_rollout)
    hf_logging.disable_progress_bar()  # a checkpoint per update: no progress bars in the service log
    try:
        parts = build(settings)
    except LearnerSetupError as exc:
        parser.error(str(exc))
    return run_service(parts)


if __name__ == "__main__":
    sys.exit(main())
