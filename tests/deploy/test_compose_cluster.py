"""compose.cluster.yaml, on top of the GPU and the CPU variant: three KRaft brokers sharing one
cluster id, Redis with a replica and three Sentinels, and every Strata service pointed at them (the
settings they build from that environment name the cluster, not STRATA_REDIS_URL). `config` of a
compose CLI, when one is installed, must render the same merge."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from strata.config import StrataSettings
from strata_tools.deploy import (
    CLUSTER_OVERRIDE,
    CPU_OVERRIDE,
    GPU_OVERRIDE,
    load,
    load_variant,
    read_env_file,
    validate,
)

REPO = Path(__file__).resolve().parents[2]
GPU_ENV = REPO / "deploy" / "gpus.env"
BROKERS = ("kafka-1", "kafka-2", "kafka-3")
SENTINELS = ("sentinel-1", "sentinel-2", "sentinel-3")
BOOTSTRAP = "kafka-1:9092,kafka-2:9092,kafka-3:9092"
SENTINEL_ADDRESSES = "sentinel-1:26379,sentinel-2:26379,sentinel-3:26379"
STRATA_SERVICES = {"strata-init", "svc_scheduler", "svc_probe", "svc_generator_l1", "svc_generator_l2",
                   "svc_reward", "svc_learner", "svc_annotation", "strata-exporter"}


def _variant(gpu: bool) -> dict[str, Any]:
    return load_variant(REPO, gpu=gpu, env=read_env_file(GPU_ENV) if gpu else {}, cluster=True)


@pytest.fixture(scope="module", params=[True, False], ids=["gpu", "cpu"])
def variant(request: pytest.FixtureRequest) -> tuple[bool, dict[str, Any]]:
    return request.param, _variant(request.param)


def _services(compose: dict[str, Any]) -> dict[str, Any]:
    return compose["services"]


def test_the_cluster_variant_is_valid(variant: tuple[bool, dict[str, Any]]) -> None:
    gpu, compose = variant
    assert validate(compose, gpu=gpu) == []


def test_the_cluster_file_leaves_devices_to_the_other_files() -> None:
    # It stacks on either device file: no device request, no device variable of its own.
    device_keys = {"CUDA_VISIBLE_DEVICES", "STRATA_DEVICE", "STRATA_ENCODER_DEVICE"}
    for service in load(REPO / CLUSTER_OVERRIDE)["services"].values():
        assert "deploy" not in service
        assert not device_keys & set(service.get("environment") or {})


def test_three_brokers_with_one_cluster_id_and_every_voter(variant: tuple[bool, dict[str, Any]]) -> None:
    _, compose = variant
    services = _services(compose)
    single = load(REPO / "compose.yaml")["services"]["kafka"]
    envs = [services[name]["environment"] for name in BROKERS]
    assert len({env["CLUSTER_ID"] for env in envs}) == 1 and envs[0]["CLUSTER_ID"]
    assert [env["KAFKA_NODE_ID"] for env in envs] == ["1", "2", "3"]
    volumes = set()
    for node, (name, env) in enumerate(zip(BROKERS, envs, strict=True), start=1):
        service = services[name]
        assert service["image"] == single["image"] == "apache/kafka:4.1.1"
        assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
        assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == "1@kafka-1:9093,2@kafka-2:9093,3@kafka-3:9093"
        assert env["KAFKA_ADVERTISED_LISTENERS"] == f"PLAINTEXT://kafka-{node}:9092"
        assert env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == "3"
        assert env["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"] == "3"
        assert env["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"] == "2"
        assert env["KAFKA_DEFAULT_REPLICATION_FACTOR"] == "3"
        assert env["KAFKA_MIN_INSYNC_REPLICAS"] == "2"
        assert service["healthcheck"] == single["healthcheck"]  # the single broker's own check
        (volume,) = service["volumes"]
        assert volume.endswith(":/var/lib/kafka/data")
        volumes.add(volume.split(":")[0])
    assert len(volumes) == 3 and volumes <= set(compose["volumes"])


def test_the_single_broker_runs_no_broker_and_waits_for_the_three(variant: tuple[bool, dict[str, Any]]) -> None:
    # compose.yaml's `kafka` cannot be removed by an override: it stays as a gate that runs a sleep
    # loop instead of the image's broker, and is healthy once the three brokers are in the cluster.
    _, compose = variant
    services = _services(compose)
    gate = services["kafka"]
    assert gate["command"][:2] == ["sh", "-c"] and "sleep" in gate["command"][2]
    assert set(gate["depends_on"]) == set(BROKERS)
    assert all(d["condition"] == "service_healthy" for d in gate["depends_on"].values())
    assert BOOTSTRAP in gate["healthcheck"]["test"][1] and "grep -qx 3" in gate["healthcheck"]["test"][1]
    # strata-init waits for the brokers and the Sentinels (its dependency on `kafka` stays: merged).
    init = services["strata-init"]["depends_on"]
    assert {"kafka", "redis", *BROKERS, *SENTINELS} <= set(init)
    assert all(init[name]["condition"] == "service_healthy" for name in (*BROKERS, *SENTINELS))


def test_redis_primary_replica_and_three_sentinels(variant: tuple[bool, dict[str, Any]]) -> None:
    _, compose = variant
    services = _services(compose)
    primary, replica = services["redis"], services["redis-replica"]
    assert primary["image"] == replica["image"] == "redis:7"
    assert primary["command"][-2:] == ["--replica-announce-ip", "redis"]
    command = " ".join(replica["command"])
    assert "--replicaof redis 6379" in command and "--replica-announce-ip redis-replica" in command
    assert replica["volumes"] == ["redis-replica-data:/data"]
    wanted = ["sentinel resolve-hostnames yes", "sentinel announce-hostnames yes",
              "sentinel monitor strata redis 6379 2", "sentinel down-after-milliseconds strata 2000",
              "sentinel failover-timeout strata 10000", "sentinel parallel-syncs strata 1"]
    volumes = set()
    for name in SENTINELS:
        sentinel = services[name]
        assert sentinel["image"] == "redis:7"
        assert sentinel["environment"] == {"SENTINEL_NAME": name}
        script = sentinel["command"][2]
        lines = script.splitlines()
        for line in wanted:
            assert line in lines, (name, line)
        # resolve-hostnames must come before a monitor line that names a host.
        assert lines.index(wanted[0]) < lines.index(wanted[2])
        assert "exec redis-server /data/sentinel.conf --sentinel" in script
        (volume,) = sentinel["volumes"]
        assert volume.endswith(":/data")
        volumes.add(volume.split(":")[0])
        assert set(sentinel["depends_on"]) == {"redis", "redis-replica"}
    assert len(volumes) == 3 and volumes <= set(compose["volumes"])


def test_every_strata_service_is_pointed_at_the_cluster(variant: tuple[bool, dict[str, Any]],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    _, compose = variant
    services = _services(compose)
    strata = {name for name, s in services.items() if str(s.get("image", "")).startswith("strata:")}
    assert strata == STRATA_SERVICES
    for key in list(os.environ):
        if key.startswith("STRATA_"):
            monkeypatch.delenv(key)
    for name in sorted(strata):
        env = {k: str(v) for k, v in services[name]["environment"].items()}
        assert env["STRATA_KAFKA_BOOTSTRAP"] == BOOTSTRAP, name
        assert env["STRATA_TOPIC_REPLICATION_FACTOR"] == "3", name
        assert env["STRATA_TOPIC_MIN_INSYNC_REPLICAS"] == "2", name
        assert env["STRATA_REDIS_SENTINELS"] == SENTINEL_ADDRESSES, name
        assert env["STRATA_REDIS_SENTINEL_PRIMARY"] == "strata", name
        assert env.get("STRATA_REDIS_URL", "") == "", name  # compose can only empty it: read as unset
        # What the service's settings make of that environment.
        with monkeypatch.context() as patch:
            for key, value in env.items():
                if key.startswith("STRATA_"):
                    patch.setenv(key, value)
            settings = StrataSettings()
        assert settings.redis_url is None and not settings.redis_managed, name
        assert settings.redis_address.startswith(f"redis+sentinel://{SENTINEL_ADDRESSES}/strata/"), name
        assert settings.kafka_address == BOOTSTRAP and not settings.kafka_managed, name
        assert (settings.replication_factor, settings.min_insync_replicas) == (3, 2), name


def test_compose_yaml_redis_url_alongside_the_sentinels_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # Why the cluster file empties STRATA_REDIS_URL: left at compose.yaml's value, no service starts.
    monkeypatch.setenv("STRATA_REDIS_URL", load(REPO / "compose.yaml")["x-strata-env"]["STRATA_REDIS_URL"])
    monkeypatch.setenv("STRATA_REDIS_SENTINELS", SENTINEL_ADDRESSES)
    with pytest.raises(ValueError, match="redis_sentinels and redis_url both name a Redis"):
        StrataSettings()


def _compose_cli() -> list[str] | None:
    for base in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(base[0]) and subprocess.run([*base, "version"], capture_output=True).returncode == 0:
            return base
    return None


@pytest.mark.skipif(_compose_cli() is None, reason="no compose CLI (docker compose or docker-compose)")
@pytest.mark.parametrize("device_file", [GPU_OVERRIDE, CPU_OVERRIDE], ids=["gpu", "cpu"])
def test_compose_config_renders_the_cluster_variant(device_file: str) -> None:
    base = _compose_cli()
    assert base is not None
    files = ["compose.yaml", device_file, CLUSTER_OVERRIDE]
    flags = [word for name in files for word in ("-f", str(REPO / name))]
    result = subprocess.run([*base, *flags, "--env-file", str(GPU_ENV), "config"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    theirs = yaml.safe_load(result.stdout)["services"]
    ours = load(*(REPO / name for name in files), env=read_env_file(GPU_ENV))["services"]
    assert set(theirs) == set(ours)
    for name, service in ours.items():
        env = {k: str(v) for k, v in (service.get("environment") or {}).items()}
        assert {k: str(v) for k, v in (theirs[name].get("environment") or {}).items()} == env, name
        depends = {k: v["condition"] for k, v in (service.get("depends_on") or {}).items()}
        assert {k: v["condition"] for k, v in (theirs[name].get("depends_on") or {}).items()} == depends, name
        # `$$` (a literal `$` in a shell command) may be rendered escaped or not.
        command = [str(word).replace("$$", "$") for word in service.get("command") or []]
        assert [str(word).replace("$$", "$") for word in theirs[name].get("command") or []] == command, name
