"""Errors every layer may raise and the command line prints for the user."""

from __future__ import annotations


class CliError(Exception):
    """A problem the user can fix; ``strata`` prints it without a traceback and exits with 2.

    Raised by commands and by the libraries they call (benches, calibration): the message names
    what to fix.
    """


class ServiceConfigError(ValueError):
    """A deployment mistake found while a service starts (a model that cannot serve the settings, ...).

    ``service_main`` logs the message, which names the setting to change, and exits with 2 instead
    of crashing with a traceback.
    """
