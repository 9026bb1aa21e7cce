"""The Helm chart at deploy/helm/strata, checked without a cluster: `helm lint` and `helm template`
with the GPU values and the CPU values (values-cpu.yaml), and the rendered manifests read back.

helm is found as STRATA_HELM, else ${STRATA_CACHE_DIR:-~/.cache/strata}/bin/helm (where
scripts/install-helm puts it), else on PATH. Without one the module is skipped, unless
STRATA_REQUIRE_HELM=1 (`make helm-check`), which makes a missing helm a failure.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from strata.bus import topics
from strata.config import StrataSettings, add_settings_flags, env_name, flag_name, settings_from_flags
from strata_tools.deploy import SETTINGS_OF_MODULE, load_variant
from svc_generator.config import GeneratorSettings
from svc_probe.config import ProbeSettings
from svc_reward.config import RewardSettings

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "strata"
CPU_VALUES = CHART / "values-cpu.yaml"
RELEASE = "t"
PREFIX = f"{RELEASE}-strata-"

# Deployment component -> its compose.yaml service.
COMPOSE_SERVICE = {
    "scheduler": "svc_scheduler",
    "probe": "svc_probe",
    "generator-l1": "svc_generator_l1",
    "generator-l2": "svc_generator_l2",
    "reward": "svc_reward",
    "learner": "svc_learner",
    "annotation": "svc_annotation",
}
# As in compose.override.yaml: the annotation desk has no model and no GPU.
GPU_COMPONENTS = set(COMPOSE_SERVICE) - {"annotation"}
# The consumer group and input topic of each scalable service, as the services' code has them.
CONSUMERS = {
    "probe": (ProbeSettings.model_fields["group_id"].default, topics.PROMPTS_LEVEL0.name),
    "generator-l1": (GeneratorSettings.model_construct(tier=1).consumer_group, topics.PROMPTS_LEVEL1.name),
    "generator-l2": (GeneratorSettings.model_construct(tier=2).consumer_group, topics.PROMPTS_LEVEL2.name),
    "reward": (RewardSettings.model_fields["group_id"].default, topics.ROLLOUTS_GENERATED.name),
}
# compose.yaml variables the chart takes from values instead (the addresses of Kafka and Redis), or
# leaves to the device plugin (which GPU a pod sees).
FROM_VALUES = {"STRATA_KAFKA_BOOTSTRAP", "STRATA_REDIS_URL"}
SECRET_WORDS = ("PASSWORD", "TOKEN", "SECRET")
SECURE = [
    "existingSecret=strata-creds", "kafka.securityProtocol=SASL_SSL", "kafka.sasl.username=strata",
    "kafka.sasl.mechanism=SCRAM-SHA-512", "kafka.tls.caSecret=strata-cluster-ca-cert", "redis.username=strata",
    "grpcTokens.existingSecret=strata-grpc-tokens", "keda.enabled=true",
]
SENTINEL = ["redis.sentinel.addresses=redis-node-0.redis-headless:26379\\,redis-node-1.redis-headless:26379",
            "redis.sentinel.master=mymaster"]


def find_helm() -> str | None:
    given = os.environ.get("STRATA_HELM")
    if given:
        if not os.access(given, os.X_OK):
            pytest.fail(f"STRATA_HELM={given} is not an executable")
        return given
    cache = Path(os.environ.get("STRATA_CACHE_DIR") or Path.home() / ".cache" / "strata")
    cached = cache / "bin" / "helm"
    if os.access(cached, os.X_OK):
        return str(cached)
    return shutil.which("helm")


@pytest.fixture(scope="module")
def helm() -> str:
    found = find_helm()
    if found is None:
        reason = ("no helm: set STRATA_HELM, run scripts/install-helm (into ${STRATA_CACHE_DIR:-~/.cache/strata}/bin)"
                  " or put helm on PATH")
        if os.environ.get("STRATA_REQUIRE_HELM") == "1":
            pytest.fail(f"STRATA_REQUIRE_HELM=1 but {reason}")
        pytest.skip(reason)
    return found


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, *args], capture_output=True, text=True, timeout=120, check=False)


def template_args(sets: tuple[str, ...], cpu: bool) -> list[str]:
    args = ["template", RELEASE, str(CHART), "--namespace", "strata"]
    if cpu:
        args += ["-f", str(CPU_VALUES)]
    for value in sets:
        args += ["--set", value]
    return args


def render(helm: str, *sets: str, cpu: bool = False) -> list[dict[str, Any]]:
    """The manifests `helm template` renders, as dicts."""
    args = template_args(sets, cpu)
    done = run_helm(helm, *args)
    assert done.returncode == 0, f"helm {' '.join(args)}:\n{done.stderr}"
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def refusal(helm: str, *sets: str, cpu: bool = False) -> str:
    """helm's error for values the chart must refuse."""
    args = template_args(sets, cpu)
    done = run_helm(helm, *args)
    assert done.returncode != 0, f"helm {' '.join(args)} rendered values it should refuse"
    return done.stderr


def of_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for doc in docs if doc["kind"] == kind}


def deployments(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Deployments by component (the name without the release prefix)."""
    found = {}
    for name, doc in of_kind(docs, "Deployment").items():
        assert name.startswith(PREFIX), name
        found[name.removeprefix(PREFIX)] = doc
    return found


def containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return list(doc["spec"]["template"]["spec"]["containers"])


def all_containers(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for doc in docs:
        if doc["kind"] in ("Deployment", "Job"):
            for container in containers(doc):
                yield doc["metadata"]["name"], container


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {entry["name"]: entry for entry in container.get("env") or []}


def env_values(container: dict[str, Any]) -> dict[str, str]:
    return {name: entry["value"] for name, entry in env_of(container).items() if "value" in entry}


def flags(command: list[str]) -> dict[str, str]:
    """``--flag value`` pairs of a command."""
    return {word: command[i + 1] for i, word in enumerate(command[:-1]) if word.startswith("--")}


def gpu_limit(container: dict[str, Any]) -> Any:
    return ((container.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu")


@pytest.fixture(scope="module")
def gpu_docs(helm: str) -> list[dict[str, Any]]:
    return render(helm)


@pytest.fixture(scope="module")
def cpu_docs(helm: str) -> list[dict[str, Any]]:
    return render(helm, cpu=True)


@pytest.fixture(scope="module")
def secure_docs(helm: str) -> list[dict[str, Any]]:
    return render(helm, *SECURE)


@pytest.mark.parametrize("cpu", [False, True], ids=["gpu", "cpu"])
def test_lint(helm: str, cpu: bool) -> None:
    args = ["lint", "--strict", str(CHART)] + (["-f", str(CPU_VALUES)] if cpu else [])
    done = run_helm(helm, *args)
    assert done.returncode == 0, done.stdout + done.stderr


def test_chart_version_and_app_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    pyproject = (REPO / "pyproject.toml").read_text()
    version = re.search(r'^version = "([^"]+)"', pyproject, re.MULTILINE)
    assert version is not None
    assert (chart["apiVersion"], chart["name"], chart["version"]) == ("v2", "strata", "0.1.0")
    assert chart["appVersion"] == version.group(1)


@pytest.mark.parametrize("variant", ["gpu", "cpu"])
def test_every_service_is_a_deployment(variant: str, gpu_docs: list[dict[str, Any]],
                                       cpu_docs: list[dict[str, Any]]) -> None:
    docs = gpu_docs if variant == "gpu" else cpu_docs
    found = deployments(docs)
    assert set(found) == set(COMPOSE_SERVICE)
    for doc in found.values():
        assert len(containers(doc)) == 1
        assert doc["spec"]["replicas"] == 1
        pod_labels = doc["spec"]["template"]["metadata"]["labels"]
        assert doc["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    images = {c["image"] for doc in found.values() for c in containers(doc)}
    assert images == {"strata:0.1.0"}


def test_replicas_and_image_are_values(helm: str) -> None:
    found = deployments(render(helm, "services.generatorL1.replicas=3", "image.repository=registry.example/strata",
                               "image.tag=abc"))
    assert found["generator-l1"]["spec"]["replicas"] == 3
    assert found["probe"]["spec"]["replicas"] == 1
    assert {containers(d)[0]["image"] for d in found.values()} == {"registry.example/strata:abc"}


def test_gpu_values_request_one_gpu_per_gpu_service(gpu_docs: list[dict[str, Any]]) -> None:
    for component, doc in deployments(gpu_docs).items():
        limits = [gpu_limit(c) for c in containers(doc) if gpu_limit(c) is not None]
        env = env_values(containers(doc)[0])
        if component in GPU_COMPONENTS:
            assert limits == [1], component
            assert "cuda:0" in (env.get("STRATA_DEVICE"), env.get("STRATA_ENCODER_DEVICE")), component
        else:
            assert limits == [], component


def test_cpu_values_request_no_gpu_and_set_what_compose_cpu_sets(cpu_docs: list[dict[str, Any]]) -> None:
    compose = load_variant(REPO, gpu=False)["services"]
    for component, doc in deployments(cpu_docs).items():
        container = containers(doc)[0]
        assert gpu_limit(container) is None, component
        assert "nvidia.com/gpu" not in yaml.safe_dump(doc)
        env = env_values(container)
        for name in ("CUDA_VISIBLE_DEVICES", "STRATA_DEVICE", "STRATA_ENCODER_DEVICE"):
            assert env.get(name) == compose[COMPOSE_SERVICE[component]]["environment"].get(name), (component, name)


def test_grpc_probes_on_each_grpc_port(gpu_docs: list[dict[str, Any]]) -> None:
    for component, doc in deployments(gpu_docs).items():
        for container in containers(doc):
            port = {p["name"]: p["containerPort"] for p in container["ports"]}["grpc"]
            assert flags(container["command"])["--grpc-port"] == str(port)
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                assert container[probe]["grpc"]["port"] == port, (component, probe)


@pytest.mark.parametrize("gpu", [True, False], ids=["gpu", "cpu"])
def test_commands_and_env_as_in_compose(gpu: bool, gpu_docs: list[dict[str, Any]],
                                        cpu_docs: list[dict[str, Any]]) -> None:
    compose = load_variant(REPO, gpu=gpu)["services"]
    for component, doc in deployments(gpu_docs if gpu else cpu_docs).items():
        service = compose[COMPOSE_SERVICE[component]]
        container = containers(doc)[0]
        command = container["command"]
        assert command[:3] == service["command"][:3], component
        assert flags(command) == flags(service["command"]), component
        env = env_values(container)
        for name, value in service["environment"].items():
            if name in FROM_VALUES or (gpu and name == "CUDA_VISIBLE_DEVICES"):
                continue  # the device plugin shows a pod its one GPU
            assert env.get(name) == str(value), (component, name)


def test_env_names_and_flags_are_settings(secure_docs: list[dict[str, Any]], helm: str) -> None:
    """Every STRATA_* variable and flag the chart renders is a setting of that service (no typo
    is silently ignored: the settings ignore unknown variables)."""
    for docs in (secure_docs, render(helm, *SENTINEL, "existingSecret=strata-creds", "redis.username=strata")):
        for name, container in all_containers(docs):
            command = container["command"]
            settings_type: type[StrataSettings] = StrataSettings
            if command[:2] == ["python", "-m"]:
                module_name, class_name = SETTINGS_OF_MODULE[command[2]].split(":")
                settings_type = getattr(importlib.import_module(module_name), class_name)
            fields = settings_type.model_fields
            for variable in env_of(container):
                if variable.startswith("STRATA_"):
                    assert variable in {env_name(f) for f in fields}, (name, variable)
            for flag in flags(command):
                assert flag in {flag_name(f) for f in fields}, (name, flag)


def expanded_env(container: dict[str, Any], secrets: Mapping[str, str]) -> dict[str, str]:
    """The container's environment as the kubelet makes it: Secret values in, $(VAR) expanded."""
    env: dict[str, str] = {}
    for entry in container.get("env") or []:
        if "valueFrom" in entry:
            env[entry["name"]] = secrets[entry["valueFrom"]["secretKeyRef"]["key"]]
        else:
            env[entry["name"]] = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                                        lambda m: env.get(m.group(1), m.group(0)), entry["value"])
    return env


@pytest.mark.parametrize("sentinel", [False, True], ids=["url", "sentinel"])
def test_settings_accept_the_rendered_env(helm: str, sentinel: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each service's settings validate from its rendered env and flags, with SASL, TLS and a Redis
    password on (e.g. Strata refuses STRATA_REDIS_URL and STRATA_REDIS_SENTINELS together)."""
    docs = render(helm, *SECURE, *(SENTINEL if sentinel else []))
    secrets = {"kafka-sasl-password": "kafka-pw", "redis-password": "redis-pw"}
    for name, container in all_containers(docs):
        command = container["command"]
        if command[:2] != ["python", "-m"]:
            continue
        for variable in list(os.environ):
            if variable.startswith("STRATA_"):
                monkeypatch.delenv(variable)
        for variable, value in expanded_env(container, secrets).items():
            monkeypatch.setenv(variable, value)
        module_name, class_name = SETTINGS_OF_MODULE[command[2]].split(":")
        settings_type = getattr(importlib.import_module(module_name), class_name)
        parser = argparse.ArgumentParser()
        add_settings_flags(parser, settings_type)  # as the services parse their command lines
        settings = settings_from_flags(settings_type, parser.parse_args(command[3:]))
        assert settings.kafka_sasl_password.get_secret_value() == "kafka-pw", name
        assert settings.topic_replication_factor == 3 and settings.topic_min_insync_replicas == 2, name
        assert not settings.redis_managed and not settings.kafka_managed, name
        if sentinel:
            assert settings.redis_url is None, name
            assert settings.redis_address.startswith("redis+sentinel://strata:redis-pw@redis-node-0"), name
            assert settings.redis_address.split("@")[1].split("/")[1] == "mymaster", name
        else:
            assert settings.redis_address == "redis://strata:redis-pw@redis-master:6379/0", name


def test_a_service_for_the_scheduler_and_the_annotation_page(gpu_docs: list[dict[str, Any]], helm: str) -> None:
    services = of_kind(gpu_docs, "Service")
    assert set(services) == {PREFIX + "scheduler", PREFIX + "annotation"}
    pods = {c: d["spec"]["template"]["metadata"]["labels"] for c, d in deployments(gpu_docs).items()}
    scheduler = services[PREFIX + "scheduler"]["spec"]
    assert scheduler["type"] == "ClusterIP"
    assert scheduler["selector"].items() <= pods["scheduler"].items()
    assert [(p["port"], p["targetPort"]) for p in scheduler["ports"]] == [(50051, "grpc")]
    annotation = services[PREFIX + "annotation"]["spec"]
    assert annotation["selector"].items() <= pods["annotation"].items()
    assert (8057, "web") in [(p["port"], p["targetPort"]) for p in annotation["ports"]]
    web = [p for p in containers(deployments(gpu_docs)["annotation"])[0]["ports"] if p["name"] == "web"]
    assert [p["containerPort"] for p in web] == [8057]
    typed = of_kind(render(helm, "services.scheduler.service.type=LoadBalancer"), "Service")
    assert typed[PREFIX + "scheduler"]["spec"]["type"] == "LoadBalancer"


def test_no_plaintext_secrets(secure_docs: list[dict[str, Any]]) -> None:
    seen = set()
    for name, container in all_containers(secure_docs):
        env = container.get("env") or []
        for entry in env:
            if any(word in entry["name"] for word in SECRET_WORDS) and entry["name"] != "STRATA_GRPC_TOKENS_FILE":
                assert "value" not in entry, (name, entry)
                assert entry["valueFrom"]["secretKeyRef"]["name"] == "strata-creds", (name, entry)
                seen.add(entry["name"])
        # $(STRATA_REDIS_PASSWORD) is expanded only from a variable defined earlier in the list.
        names = [entry["name"] for entry in env]
        url = env_values(container)["STRATA_REDIS_URL"]
        assert url == "redis://strata:$(STRATA_REDIS_PASSWORD)@redis-master:6379/0", name
        assert names.index("STRATA_REDIS_PASSWORD") < names.index("STRATA_REDIS_URL"), name
    assert seen == {"STRATA_KAFKA_SASL_PASSWORD", "STRATA_REDIS_PASSWORD"}
    trigger_auth = of_kind(secure_docs, "TriggerAuthentication")[PREFIX.rstrip("-") + "-kafka"]
    assert {ref["parameter"] for ref in trigger_auth["spec"]["secretTargetRef"]} == {"password", "ca"}


def test_no_secret_no_credential_env(gpu_docs: list[dict[str, Any]], cpu_docs: list[dict[str, Any]]) -> None:
    for docs in (gpu_docs, cpu_docs):
        assert "secretKeyRef" not in yaml.safe_dump_all(docs)
        for name, container in all_containers(docs):
            env = env_values(container)
            assert not {n for n in env_of(container) if any(w in n for w in SECRET_WORDS)}, name
            assert env["STRATA_REDIS_URL"] == "redis://redis-master:6379/0", name
            assert env["STRATA_KAFKA_SECURITY_PROTOCOL"] == "PLAINTEXT", name


def test_topic_replication_and_sentinel_env(gpu_docs: list[dict[str, Any]], helm: str) -> None:
    for name, container in all_containers(gpu_docs):
        env = env_values(container)
        assert env["STRATA_TOPIC_REPLICATION_FACTOR"] == "3", name
        assert env["STRATA_TOPIC_MIN_INSYNC_REPLICAS"] == "2", name
        assert "STRATA_REDIS_SENTINELS" not in env, name
    docs = render(helm, *SENTINEL, "kafka.replicationFactor=5", "kafka.minInsyncReplicas=3")
    for name, container in all_containers(docs):
        env = env_values(container)
        assert (env["STRATA_TOPIC_REPLICATION_FACTOR"], env["STRATA_TOPIC_MIN_INSYNC_REPLICAS"]) == ("5", "3")
        assert env["STRATA_REDIS_SENTINELS"] == "redis-node-0.redis-headless:26379,redis-node-1.redis-headless:26379"
        assert env["STRATA_REDIS_SENTINEL_PRIMARY"] == "mymaster", name
        assert "STRATA_REDIS_URL" not in env, name  # Strata refuses both


def test_keda_scaled_objects_only_when_enabled(gpu_docs: list[dict[str, Any]],
                                               secure_docs: list[dict[str, Any]]) -> None:
    assert not of_kind(gpu_docs, "ScaledObject") and not of_kind(gpu_docs, "TriggerAuthentication")
    scaled = of_kind(secure_docs, "ScaledObject")
    assert set(scaled) == {PREFIX + component for component in CONSUMERS}
    found = deployments(secure_docs)
    for component, (group, topic) in CONSUMERS.items():
        spec = scaled[PREFIX + component]["spec"]
        assert spec["scaleTargetRef"]["name"] == found[component]["metadata"]["name"]
        assert spec["maxReplicaCount"] == 12  # the partitions
        [trigger] = spec["triggers"]
        assert trigger["type"] == "kafka"
        assert (trigger["metadata"]["consumerGroup"], trigger["metadata"]["topic"]) == (group, topic)
        assert trigger["metadata"]["sasl"] == "scram_sha512" and trigger["metadata"]["tls"] == "enable"
        assert trigger["authenticationRef"]["name"] == PREFIX + "kafka"
        assert "replicas" not in found[component]["spec"]  # KEDA's HPA owns it
    assert found["scheduler"]["spec"]["replicas"] == 1


def test_topics_job_is_a_hook_running_strata_infra_up(gpu_docs: list[dict[str, Any]], helm: str) -> None:
    [job] = of_kind(gpu_docs, "Job").values()
    assert "pre-install" in job["metadata"]["annotations"]["helm.sh/hook"]
    assert containers(job)[0]["command"] == ["strata", "infra", "up"]
    assert not of_kind(render(helm, "topics.create=false"), "Job")


@pytest.mark.parametrize(("sets", "cpu", "message"), [
    (["kafka.securityProtocol=SASL_SSL"], False, "needs kafka.sasl.username"),
    (["gpu.enabled=false"], False, "values-cpu.yaml"),
    (["redis.url=redis://user:pw@redis:6379/0"], False, "without credentials"),
    (["redis.sentinel.addresses=s:26379"], False, "go together"),
    (["kafka.replicationFactor=1"], True, "minInsyncReplicas"),
], ids=["sasl-without-secret", "cuda-without-gpu", "password-in-url", "sentinel-without-master", "min-isr"])
def test_values_that_cannot_work_are_refused(helm: str, sets: list[str], cpu: bool, message: str) -> None:
    assert message in refusal(helm, *sets, cpu=cpu)
