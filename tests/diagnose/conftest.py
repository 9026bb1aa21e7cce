"""Fixtures of the diagnose tests: tiny models in a session tmp dir, one torch thread."""

from __future__ import annotations

import pytest
from diagutil import TinyModels, build_models
from torchutil import one_torch_thread


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    return build_models(tmp_path_factory.mktemp("diagnose-models"))


__all__ = ["one_torch_thread"]
