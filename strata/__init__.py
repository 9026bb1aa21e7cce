"""Strata's shared library: contracts (``strata.v1``), hashing, content store, bus, config, telemetry,
local infrastructure, model loading and the ``strata`` CLI."""

__version__ = "0.1.0"
