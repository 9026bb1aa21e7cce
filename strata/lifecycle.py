"""Process lifecycle: SIGTERM / SIGINT become a stop event that loops and servers watch."""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType

log = logging.getLogger(__name__)


def stop_on_signals(stop: threading.Event | None = None) -> threading.Event:
    """Set the returned event on SIGTERM or SIGINT (drain, commit, exit cleanly)."""
    event = stop or threading.Event()

    def _handle(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s, draining", signal.Signals(signum).name)
        event.set()

    signal.signal(signal.SIGTERM, _handle)
    signal.signal(signal.SIGINT, _handle)
    return event
