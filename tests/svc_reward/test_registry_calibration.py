"""A light RM version's score calibration in the registry: stored with its entry, carried by
``describe`` and ``register_served`` from the file beside the weights."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from strata.contract.checksums import weights_checksum
from strata_tools.rm.calibration import fit_isotonic
from strata_tools.rm.registry import RmRegistryAdmin
from svc_reward.calibrate import ScoreCalibration
from svc_reward.calibration_store import CALIBRATION_FILE, write_calibration
from svc_reward.registry import RegistryError, RmVersion, UnknownVersionError, describe, register_served


@pytest.fixture
def registry(redis_client: redis.Redis) -> RmRegistryAdmin:
    return RmRegistryAdmin(redis_client, prefix=f"test:rm:{uuid.uuid4().hex[:10]}")


def fitted_for(model_dir: Path) -> ScoreCalibration:
    return fit_isotonic([1.0, 2.0, 3.0, 4.0], [1.0, 3.0, 2.0, 4.0], checksum=weights_checksum([model_dir]),
                        source="test", now=7.0)


def test_an_entry_written_before_calibrations_still_loads(make_rm: Callable[..., Path]) -> None:
    data = json.loads(describe("light", [make_rm("a", 3.0)]).to_json())
    del data["calibration"]
    assert RmVersion.from_json(json.dumps(data)).calibration is None


def test_describe_carries_a_valid_calibration_fitted_for_the_weights(make_rm: Callable[..., Path]) -> None:
    light, other = make_rm("a", 3.0), make_rm("b", 4.0)
    assert describe("light", [light]).calibration is None
    cal = fitted_for(light)
    write_calibration(light, cal)
    assert describe("light", [light]).calibration == cal.to_dict()
    write_calibration(light, fitted_for(other))  # another version's: not this one's entry
    assert describe("light", [light]).calibration is None
    (light / CALIBRATION_FILE).write_text("{broken")
    assert describe("light", [light]).calibration is None  # never fails on a bad file
    write_calibration(other, fitted_for(other))
    assert describe("strong", [other]).calibration is None  # only light RMs are calibrated


@pytest.mark.integration
def test_set_calibration_round_trip(registry: RmRegistryAdmin, make_rm: Callable[..., Path]) -> None:
    light = make_rm("a", 3.0)
    entry = registry.register(describe("light", [light]))
    assert registry.get(entry.version).calibration is None
    cal = fitted_for(light)
    updated = registry.set_calibration(entry.version, cal)
    stored = registry.get(entry.version)
    assert stored == updated and stored.registered_at == entry.registered_at  # the rest of the entry kept
    assert stored.calibration is not None and ScoreCalibration.from_dict(stored.calibration) == cal
    assert registry.list("light")[0].calibration == cal.to_dict()


@pytest.mark.integration
def test_set_calibration_refuses_unknown_strong_and_foreign(registry: RmRegistryAdmin,
                                                           make_rm: Callable[..., Path]) -> None:
    light, strong = make_rm("a", 3.0), make_rm("s", 2.0)
    with pytest.raises(UnknownVersionError):
        registry.set_calibration("light-000000000000", fitted_for(light))
    strong_entry = registry.register(describe("strong", [strong]))
    with pytest.raises(RegistryError, match="strong RM"):
        registry.set_calibration(strong_entry.version, fitted_for(strong))
    light_entry = registry.register(describe("light", [light]))
    with pytest.raises(RegistryError, match="fitted for weights"):
        registry.set_calibration(light_entry.version, fitted_for(strong))
    assert registry.get(light_entry.version).calibration is None


@pytest.mark.integration
def test_the_served_entry_catches_up_with_a_calibration_written_later(
    registry: RmRegistryAdmin, make_rm: Callable[..., Path],
) -> None:
    light = make_rm("a", 3.0)
    register_served(registry, [light], None)  # first start: no calibration yet
    version = describe("light", [light]).version
    assert registry.get(version).calibration is None
    cal = fitted_for(light)
    write_calibration(light, cal)  # `strata calibrate escalation --write` while Redis was down
    register_served(registry, [light], None)  # the next start
    assert registry.get(version).calibration == cal.to_dict()
