"""Progress bars that redraw at their own pace.

A bar whose count does not move between rounds (the demo's policy updates) is redrawn by hand to
show the round's figures; ``tqdm.refresh`` ignores ``mininterval``, so on a pipe (30 s there, see
``strata_tools.cli``) every round would be a line of the log.
"""

from __future__ import annotations

import time

from tqdm import tqdm


def redraw(bar: tqdm) -> None:
    """Draw ``bar`` again unless it drew less than its ``mininterval`` ago (or it draws nothing: a bar
    disabled by ``TQDM_DISABLE``, which a process inherits from a parent writing to a log)."""
    if bar.disable:
        return
    if time.time() - bar.last_print_t >= bar.mininterval:
        bar.refresh()
