"""Errors every layer may raise and the command line prints for the user."""

from __future__ import annotations


class CliError(Exception):
    """A problem the user can fix; ``strata`` prints it without a traceback and exits with 2.

    Raised by commands and by the libraries they call (benches, calibration): the message names
    what to fix.
    """
