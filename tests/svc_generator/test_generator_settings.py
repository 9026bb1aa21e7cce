"""Generator settings: the tier from the environment, the gRPC port of each tier."""

from __future__ import annotations

import pytest

from svc_generator.config import GeneratorSettings


@pytest.mark.parametrize(("tier", "port", "resolved"), [
    (1, None, 50053),  # unset: the tier's well-known port (strata up, compose)
    (2, None, 50054),
    (2, 0, 0),  # 0: any free port, as for every service (in-process tests run both tiers at once)
    (2, 6001, 6001),
])
def test_grpc_port_per_tier(tier: int, port: int | None, resolved: int) -> None:
    assert GeneratorSettings(tier=tier, grpc_port=port).resolved_grpc_port == resolved


def test_the_tier_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRATA_TIER", "2")
    assert GeneratorSettings().tier == 2
    monkeypatch.setenv("STRATA_TIER", "3")
    with pytest.raises(ValueError, match="tier"):
        GeneratorSettings()
