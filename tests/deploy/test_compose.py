"""compose.yaml is validated statically (no Docker engine here) and by `docker compose config` when
a Docker CLI with compose is present."""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from strata.deploy import interpolate, load, read_env_file, validate

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load(REPO / "compose.yaml", read_env_file(REPO / "deploy" / "gpus.env"))


def test_shipped_compose_is_valid(compose: dict[str, Any]) -> None:
    assert validate(compose) == []


def test_default_gpu_map_without_env_file_is_valid() -> None:
    assert validate(load(REPO / "compose.yaml")) == []


def test_every_gpu_service_has_its_own_gpu(compose: dict[str, Any]) -> None:
    pinned = {
        name: s["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"][0]
        for name, s in compose["services"].items() if "deploy" in s
    }
    assert len(pinned) == 6
    assert len(set(pinned.values())) == 6


def test_models_and_checkpoints_are_named_volumes(compose: dict[str, Any]) -> None:
    assert {"models", "checkpoints", "kafka-data", "redis-data"} <= set(compose["volumes"])
    learner = compose["services"]["svc_learner"]
    assert "checkpoints:/checkpoints" in learner["volumes"]


def broken(compose: dict[str, Any], edit) -> list[str]:
    changed = copy.deepcopy(compose)
    edit(changed["services"])
    return validate(changed)


def _devices(service: dict[str, Any]) -> list:
    return service["deploy"]["resources"]["reservations"]["devices"]


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda s: _devices(s["svc_reward"])[0].update(device_ids=["2"]),
         "svc_reward and svc_generator_l1 are both pinned to GPU 2"),
        (lambda s: _devices(s["svc_probe"])[0].update(device_ids=["1", "2"]), "device_ids must name exactly one GPU"),
        (lambda s: s["svc_probe"].pop("deploy"), "svc_probe: needs exactly one deploy.resources"),
        (lambda s: s["svc_probe"]["environment"].update(CUDA_VISIBLE_DEVICES="1"), "CUDA_VISIBLE_DEVICES must be 0"),
        (lambda s: s["svc_reward"].pop("healthcheck"), "svc_reward: healthcheck must be the gRPC health check"),
        (lambda s: s["svc_reward"]["healthcheck"].update(test=["CMD", "strata", "health", "127.0.0.1:50051"]),
         "svc_reward: healthcheck must be the gRPC health check on its port (50056)"),
        (lambda s: s["svc_generator_l1"].update(container_name="gen"), "must not set container_name"),
        (lambda s: s["svc_generator_l1"].update(ports=["50053:50053"]), "must not publish host ports"),
        (lambda s: s["svc_probe"]["environment"].update(STRATA_NO_SUCH_SETTING="1"),
         "STRATA_NO_SUCH_SETTING is not read by ProbeSettings"),
        (lambda s: s["svc_probe"].update(command=["python", "-m", "svc_probe", "--grpc-port", "50052",
                                                  "--device", "cuda:0", "--bogus-flag", "1"]),
         "flags not read by ProbeSettings"),
        (lambda s: s["svc_probe"].update(command=["python", "-m", "svc_nope", "--grpc-port", "50052"]),
         "module 'svc_nope' of its command does not exist"),
        (lambda s: s["svc_probe"]["volumes"].append("unknown-volume:/x"), "volume 'unknown-volume' is not declared"),
        (lambda s: s.pop("svc_reward"), "service svc_reward is missing"),
    ],
    ids=["shared-gpu", "two-gpus", "no-gpu", "visible-devices", "no-healthcheck", "wrong-port", "container-name",
         "host-port", "unknown-env", "unknown-flag", "unknown-module", "undeclared-volume", "missing-service"],
)
def test_broken_files_are_rejected(compose: dict[str, Any], edit, expected: str) -> None:
    errors = broken(compose, edit)
    assert any(expected in e for e in errors), errors


def test_interpolation_uses_env_then_default() -> None:
    assert interpolate(["${A:-1}", "${B:-2}", "${C}"], {"A": "7"}) == ["7", "2", ""]


@pytest.mark.skipif(not (shutil.which("docker-compose") or shutil.which("docker")), reason="no Docker CLI")
def test_docker_compose_config_accepts_the_file() -> None:
    candidates = [["docker", "compose"], ["docker-compose"]]
    for base in candidates:
        if shutil.which(base[0]) and subprocess.run([*base, "version"], capture_output=True).returncode == 0:
            result = subprocess.run([*base, "-f", str(REPO / "compose.yaml"), "--env-file",
                                     str(REPO / "deploy" / "gpus.env"), "config", "-q"], capture_output=True, text=True)
            assert result.returncode == 0, result.stderr
            return
    pytest.skip("no Docker CLI with compose")
