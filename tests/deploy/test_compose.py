"""The compose files are validated statically, in both variants (GPU pinning and CPU), and by
`docker compose config` when a Docker CLI with compose is present. `make compose-test` runs them."""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from strata_tools.deploy import CPU_OVERRIDE, GPU_OVERRIDE, interpolate, load, load_variant, read_env_file, validate

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_variant(REPO, gpu=True, env=read_env_file(REPO / "deploy" / "gpus.env"))


def test_shipped_compose_is_valid(compose: dict[str, Any]) -> None:
    assert validate(compose) == []


def test_default_gpu_map_without_env_file_is_valid() -> None:
    assert validate(load_variant(REPO, gpu=True)) == []


def test_the_cpu_variant_requests_no_device_and_runs_on_the_cpu() -> None:
    assert validate(load_variant(REPO, gpu=False), gpu=False) == []
    # The GPU variant is not a valid CPU one, and the reverse: the check can fail.
    assert validate(load_variant(REPO, gpu=True), gpu=False)
    assert validate(load_variant(REPO, gpu=False), gpu=True)


def test_the_overrides_change_devices_only() -> None:
    # Everything else lives in compose.yaml, so the two variants cannot drift apart.
    device_keys = {"CUDA_VISIBLE_DEVICES", "STRATA_DEVICE", "STRATA_ENCODER_DEVICE"}
    gpu, cpu = (load(REPO / name)["services"] for name in (GPU_OVERRIDE, CPU_OVERRIDE))
    assert set(gpu) == set(cpu)
    for service in cpu.values():
        assert set(service) == {"environment"} and set(service["environment"]) <= device_keys
    for service in gpu.values():
        assert set(service) == {"environment", "deploy"} and set(service["environment"]) <= device_keys
    base = load(REPO / "compose.yaml")["services"]
    for service in base.values():
        assert "deploy" not in service and not device_keys & set(service.get("environment") or {})


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


def _reservations(service: dict[str, Any]) -> Any:
    return ((service.get("deploy") or {}).get("resources") or {}).get("reservations")


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
            for files in (["compose.yaml", GPU_OVERRIDE], ["compose.yaml", CPU_OVERRIDE]):
                flags = [word for name in files for word in ("-f", str(REPO / name))]
                result = subprocess.run([*base, *flags, "--env-file", str(REPO / "deploy" / "gpus.env"), "config"],
                                        capture_output=True, text=True)
                assert result.returncode == 0, result.stderr
                # Our merge (what the checks above read) is docker compose's, for every service's
                # environment, command and device requests.
                theirs = yaml.safe_load(result.stdout)["services"]
                ours = load(*(REPO / name for name in files), env=read_env_file(REPO / "deploy" / "gpus.env"))
                for name, service in ours["services"].items():
                    env = {k: str(v) for k, v in (service.get("environment") or {}).items()}
                    assert {k: str(v) for k, v in (theirs[name].get("environment") or {}).items()} == env, name
                    assert theirs[name].get("command") == service.get("command"), name
                    assert _reservations(theirs[name]) == _reservations(service), name
            return
    pytest.skip("no Docker CLI with compose")
