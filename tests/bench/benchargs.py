"""A bench's flags as its parser gives them by default, with some set by hand (the benches' argument tests)."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def default_args(add_arguments: Callable[[argparse.ArgumentParser], None], **overrides: object) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([])
    for name, value in overrides.items():
        setattr(args, name, value)
    return args
