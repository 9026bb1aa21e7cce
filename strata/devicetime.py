"""The clock that device-seconds (R4) are measured with.

On a GPU each service has its own device, and a batch's wall time (outputs copied back to the host,
which waits for the kernels) is its device time. On a CPU the services share the cores: wall time
would also count the time a batch waited while another service computed, so device-seconds are the
process's CPU seconds over the batch (core-seconds: two busy threads for one second count two).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def device_clock(device: Any) -> Callable[[], float]:
    """``time.process_time`` for a CPU device, ``time.perf_counter`` for any other (``torch.device`` or str)."""
    kind = getattr(device, "type", None) or str(device).split(":", 1)[0]
    return time.process_time if kind == "cpu" else time.perf_counter
