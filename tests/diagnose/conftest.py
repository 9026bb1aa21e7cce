"""Fixtures of the diagnose tests: tiny models in a session tmp dir, one torch thread."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from diagutil import TinyModels, build_models


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    return build_models(tmp_path_factory.mktemp("diagnose-models"))


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    # Tiny models on a shared 2-core machine: one thread beats two fighting other processes.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
