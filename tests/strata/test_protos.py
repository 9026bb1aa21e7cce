"""The contracts: generated code is fresh, and every event carries what its consumers need."""

import importlib.util
import sys
from pathlib import Path

import pytest
from google.protobuf.descriptor import FieldDescriptor

from strata.v1 import events_pb2

REPO = Path(__file__).resolve().parents[2]


def _load_generator():
    spec = importlib.util.spec_from_file_location("gen_protos", REPO / "scripts" / "gen_protos.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_protos"] = module
    spec.loader.exec_module(module)
    return module


def test_generated_code_is_not_stale(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools (dev extra) is needed to regenerate")
    fresh = {p.name: p.read_bytes() for p in _load_generator().generate(tmp_path)}
    committed = {p.name: p.read_bytes() for p in (REPO / "strata" / "v1").glob("*_pb2*.py*")}
    assert fresh.keys() == committed.keys(), "generated file set differs: run `make protos`"
    stale = sorted(name for name in fresh if fresh[name] != committed[name])
    assert not stale, f"stale generated code {stale}: run `make protos` and commit the result"


ROLLOUT_EVENTS = [
    events_pb2.PromptRouted, events_pb2.RolloutGenerated, events_pb2.RewardScored,
    events_pb2.AnnotationRequested, events_pb2.AnnotationCompleted,
]


@pytest.mark.parametrize("message_type", ROLLOUT_EVENTS, ids=lambda m: m.__name__)
def test_rollout_events_carry_hash_versions_and_time(message_type: type) -> None:
    fields = message_type.DESCRIPTOR.fields_by_name
    assert "prompt_hash" in fields
    assert "policy_version" in fields
    timestamps = [
        f for f in fields.values() if f.message_type and f.message_type.full_name == "google.protobuf.Timestamp"
    ]
    assert timestamps, f"{message_type.__name__} has no timestamp"


@pytest.mark.parametrize(
    "message_type",
    [events_pb2.RolloutGenerated, events_pb2.RewardScored, events_pb2.AnnotationRequested,
     events_pb2.AnnotationCompleted],
    ids=lambda m: m.__name__,
)
def test_events_about_a_response_carry_its_hash(message_type: type) -> None:
    assert "response_hash" in message_type.DESCRIPTOR.fields_by_name


def test_rewards_carry_the_rm_version_and_tier() -> None:
    fields = events_pb2.RewardScored.DESCRIPTOR.fields_by_name
    assert {"rm_version", "tier", "reward", "scored_at"} <= set(fields)


def test_rollout_log_record_has_exactly_three_fields() -> None:
    fields = events_pb2.RolloutLogRecord.DESCRIPTOR.fields
    assert [(f.name, f.type) for f in fields] == [
        ("prompt_hash", FieldDescriptor.TYPE_STRING),
        ("response_hash", FieldDescriptor.TYPE_STRING),
        ("reward", FieldDescriptor.TYPE_DOUBLE),
    ]


def test_every_service_is_in_the_contracts() -> None:
    from strata.v1 import generator_pb2, learner_pb2, probe_pb2, reward_pb2, scheduler_pb2

    services = {
        name
        for module in (scheduler_pb2, probe_pb2, generator_pb2, reward_pb2, learner_pb2)
        for name in module.DESCRIPTOR.services_by_name
    }
    assert services == {"Scheduler", "Probe", "Generator", "Reward", "Learner"}
    methods = {m.name for m in scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"].methods}
    assert {"Submit", "SubmitBatch", "Watch", "Stats"} <= methods
