"""Static validation of the compose files, in both variants (``make compose-test`` runs them for real).

``compose.yaml`` holds the services; ``compose.override.yaml`` (read by default) pins each GPU
service to its own GPU; ``compose.cpu.yaml`` runs every service on the CPU with no device request;
``compose.cluster.yaml``, on top of either, runs three Kafka brokers and Redis with Sentinel.
:func:`load` merges files as docker compose does for the keys we use.

Checks: on GPUs, each GPU service pinned to exactly one GPU and no GPU shared, with
``CUDA_VISIBLE_DEVICES`` and the service's device (flag or ``STRATA_DEVICE``) agreeing with the
pinning; on the CPU, no device request and every device ``cpu``; a gRPC health check on the
service's own port; named volumes declared; every command is a module that exists and whose flags
its settings accept; every ``STRATA_*`` variable is read by that service's settings; scalable
services have neither a ``container_name`` nor host ports. Tests run it on broken copies.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from strata.config import StrataSettings, add_settings_flags

SETTINGS_OF_MODULE = {
    "svc_scheduler": "svc_scheduler.config:SchedulerSettings",
    "svc_probe": "svc_probe.config:ProbeSettings",
    "svc_generator": "svc_generator.config:GeneratorSettings",
    "svc_reward": "svc_reward.config:RewardSettings",
    "svc_learner": "svc_learner.config:LearnerSettings",
    "svc_annotation": "svc_annotation.config:AnnotationSettings",
}
EXPECTED_SERVICES = ("svc_scheduler", "svc_probe", "svc_generator_l1", "svc_generator_l2", "svc_reward",
                     "svc_learner")
# Services without a model: checked like the others, but they run on the CPU in both variants.
CPU_ONLY_SERVICES = ("svc_annotation",)
SCALABLE_SERVICES = ("svc_probe", "svc_generator_l1", "svc_generator_l2", "svc_reward")
DEVICE_FLAGS = ("--device", "--encoder-device")
DEVICE_VARIABLES = ("STRATA_DEVICE", "STRATA_ENCODER_DEVICE")
GPU_OVERRIDE = "compose.override.yaml"
CPU_OVERRIDE = "compose.cpu.yaml"
CLUSTER_OVERRIDE = "compose.cluster.yaml"
# Variables that are not settings but are read by libraries inside the container.
NON_SETTINGS_ENV = {"HF_HUB_OFFLINE", "CUDA_VISIBLE_DEVICES", "TRANSFORMERS_OFFLINE", "TQDM_MININTERVAL"}

_VAR = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


def read_env_file(path: str | Path) -> dict[str, str]:
    env = {}
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            env[key.strip()] = value.strip()
    return env


def interpolate(value: Any, env: Mapping[str, str]) -> Any:
    """Compose-style ``${VAR}`` / ``${VAR:-default}`` substitution, recursively."""
    if isinstance(value, str):
        return _VAR.sub(lambda m: env.get(m.group(1), m.group(2) or ""), value)
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    return value


def load(*paths: str | Path, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The files merged in order (a later file's service keys replace, its environment and
    depends_on entries are added; top-level mappings are merged), then interpolated."""
    merged: dict[str, Any] = {}
    for path in paths:
        document = yaml.safe_load(Path(path).read_text()) or {}
        for key, value in document.items():
            if key == "services":
                services = merged.setdefault("services", {})
                for name, service in value.items():
                    services[name] = _merge_service(services.get(name, {}), service or {})
            elif isinstance(value, dict) and isinstance(merged.get(key), dict):
                merged[key] = {**merged[key], **value}
            else:
                merged[key] = value
    return interpolate(merged, env or {})


def load_variant(root: str | Path, gpu: bool, env: Mapping[str, str] | None = None,
                 cluster: bool = False) -> dict[str, Any]:
    """``compose.yaml`` with the GPU pinning (what ``docker compose up`` reads) or the CPU override,
    and with ``cluster`` the three brokers and Sentinel on top (``compose.cluster.yaml``)."""
    root = Path(root)
    paths = [root / "compose.yaml", root / (GPU_OVERRIDE if gpu else CPU_OVERRIDE)]
    if cluster:
        paths.append(root / CLUSTER_OVERRIDE)
    return load(*paths, env=env)


def _merge_service(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = {**base, **override}
    if "environment" in base and "environment" in override:
        merged["environment"] = {**base["environment"], **override["environment"]}
    if "depends_on" in base and "depends_on" in override:
        # Compose merges dependencies too: an override adds to them and cannot remove one.
        merged["depends_on"] = {**_depends_on(base["depends_on"]), **_depends_on(override["depends_on"])}
    return merged


def _depends_on(value: Any) -> dict[str, Any]:
    if isinstance(value, list):
        return {name: {"condition": "service_started"} for name in value}
    return dict(value or {})


def _device(command: list[str], environment: Mapping[str, Any]) -> str | None:
    flag = _flag_value(command, DEVICE_FLAGS)
    if flag is not None:
        return flag
    return next((str(environment[v]) for v in DEVICE_VARIABLES if v in environment), None)


def _settings_class(module: str) -> type[StrataSettings] | None:
    target = SETTINGS_OF_MODULE.get(module)
    if target is None:
        return None
    module_name, class_name = target.split(":")
    return getattr(importlib.import_module(module_name), class_name)


def _flag_value(command: list[str], flags: tuple[str, ...]) -> str | None:
    for i, word in enumerate(command[:-1]):
        if word in flags:
            return command[i + 1]
    return None


def _check_command(name: str, command: list[str], environment: Mapping[str, Any], errors: list[str]) -> None:
    if command[:2] != ["python", "-m"] or len(command) < 3:
        errors.append(f"{name}: command must be `python -m <service module> ...`, got {command}")
        return
    module = command[2]
    if importlib.util.find_spec(module) is None or importlib.util.find_spec(f"{module}.__main__") is None:
        errors.append(f"{name}: module {module!r} of its command does not exist or has no __main__")
        return
    settings_class = _settings_class(module)
    if settings_class is None:
        errors.append(f"{name}: {module} is not a Strata service module")
        return
    parser = argparse.ArgumentParser(prog=module, add_help=False, exit_on_error=False)
    add_settings_flags(parser, settings_class)
    try:
        _, unknown = parser.parse_known_args(command[3:])
    except argparse.ArgumentError as exc:
        errors.append(f"{name}: bad flag value in its command: {exc}")
        return
    if unknown:
        errors.append(f"{name}: flags not read by {settings_class.__name__}: {unknown}")
    fields = set(settings_class.model_fields)
    for key in environment:
        if key.startswith("STRATA_") and key[len("STRATA_"):].lower() not in fields:
            errors.append(f"{name}: environment variable {key} is not read by {settings_class.__name__}")
        elif not key.startswith("STRATA_") and key not in NON_SETTINGS_ENV:
            errors.append(f"{name}: environment variable {key} is not used by Strata")


def _check_gpu(name: str, devices: Any, command: list[str], environment: Mapping[str, Any],
               gpu_owner: dict[str, str], errors: list[str]) -> None:
    if not isinstance(devices, list) or len(devices) != 1:
        errors.append(f"{name}: needs exactly one deploy.resources.reservations.devices entry (one GPU)")
        return
    device = devices[0] or {}
    ids = device.get("device_ids")
    if device.get("driver") != "nvidia" or "gpu" not in (device.get("capabilities") or []):
        errors.append(f"{name}: the device reservation needs driver nvidia and capabilities [gpu]")
    if not isinstance(ids, list) or len(ids) != 1 or not str(ids[0]).strip():
        errors.append(f"{name}: device_ids must name exactly one GPU, got {ids!r}")
    else:
        gpu = str(ids[0]).strip()
        if gpu in gpu_owner:
            errors.append(f"{name} and {gpu_owner[gpu]} are both pinned to GPU {gpu}")
        gpu_owner.setdefault(gpu, name)
    if str(environment.get("CUDA_VISIBLE_DEVICES")) != "0":
        errors.append(f"{name}: CUDA_VISIBLE_DEVICES must be 0 (the one reserved GPU inside the container)")
    if _device(command, environment) != "cuda:0":
        errors.append(f"{name}: its device (--device or STRATA_DEVICE) must be cuda:0 (the reserved GPU)")


def validate(compose: Mapping[str, Any], gpu: bool = True) -> list[str]:
    """Problems found in an (interpolated, merged) compose configuration; empty when it is fine.
    ``gpu``: the GPU variant (each service pinned) or the CPU one (no device requested)."""
    errors: list[str] = []
    services: Mapping[str, Any] = compose.get("services") or {}
    declared_volumes = set((compose.get("volumes") or {}).keys())
    for expected in (*EXPECTED_SERVICES, *CPU_ONLY_SERVICES):
        if expected not in services:
            errors.append(f"service {expected} is missing")
    gpu_owner: dict[str, str] = {}
    for name, service in services.items():
        for volume in service.get("volumes") or []:
            source = str(volume).split(":")[0]
            if not source.startswith((".", "/")) and source not in declared_volumes:
                errors.append(f"{name}: volume {source!r} is not declared under top-level volumes")
        if name not in EXPECTED_SERVICES and name not in CPU_ONLY_SERVICES:
            continue
        command = [str(c) for c in service.get("command") or []]
        environment = service.get("environment") or {}
        _check_command(name, command, environment, errors)
        devices = (((service.get("deploy") or {}).get("resources") or {}).get("reservations") or {}).get("devices")
        if name in CPU_ONLY_SERVICES:
            if devices:
                errors.append(f"{name}: it runs no model and must not reserve a device, got {devices!r}")
        elif gpu:
            _check_gpu(name, devices, command, environment, gpu_owner, errors)
        else:
            if devices:
                errors.append(f"{name}: the CPU variant must not request a device, got {devices!r}")
            if _device(command, environment) != "cpu" or str(environment.get("CUDA_VISIBLE_DEVICES", "")) != "":
                errors.append(f"{name}: the CPU variant must set its device to cpu and hide GPUs "
                              "(CUDA_VISIBLE_DEVICES empty)")
        port = _flag_value(command, ("--grpc-port",))
        test = [str(t) for t in ((service.get("healthcheck") or {}).get("test") or [])]
        if port is None:
            errors.append(f"{name}: its command must set --grpc-port")
        elif "strata" not in test or "health" not in test or f"127.0.0.1:{port}" not in test:
            errors.append(f"{name}: healthcheck must be the gRPC health check on its port ({port}): "
                          f"[CMD, strata, health, 127.0.0.1:{port}]")
        if name in SCALABLE_SERVICES:
            if "container_name" in service:
                errors.append(f"{name}: a scalable service must not set container_name")
            if service.get("ports"):
                errors.append(f"{name}: a scalable service must not publish host ports")
    return errors
