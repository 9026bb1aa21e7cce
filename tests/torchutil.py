"""``one_torch_thread``: an autouse fixture for the directories that train or run tiny models.

A directory's conftest imports it. Tiny models on a shared 2-core machine run several times faster
on one thread than on two fighting other processes; the setting is restored afterwards so other
test directories keep theirs.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
