"""The adversarial suite's helpers: the locked-down stack's handle and a reader of what became of
submitted prompts (final rewards, dead letters)."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from strata import rpc
from strata.bus import topics
from strata.bus.tail import TailReader
from strata.config import StrataSettings
from strata.tlsgen import DevPki
from strata.v1 import scheduler_pb2_grpc


@dataclass
class Edge:
    """The locked-down stack: addresses, credentials and a channel per client."""

    infra: StrataSettings
    pki: DevPki
    tokens: dict[str, str]
    ports: dict[str, int]
    scheduler_settings: object
    scheduler_servicer: object
    channels: list[grpc.Channel] = field(default_factory=list)

    def client_settings(self, token: str | None, tls: bool = True) -> StrataSettings:
        return StrataSettings(grpc_tls_ca=self.pki.ca if tls else None, grpc_token=token)

    def channel(self, service: str, client: str | None = "alice", token: str | None = None,
                tls: bool = True) -> grpc.Channel:
        token = token if token is not None else (self.tokens[client] if client else None)
        made = rpc.channel(f"127.0.0.1:{self.ports[service]}", self.client_settings(token, tls))
        self.channels.append(made)
        return made

    def scheduler(self, client: str | None = "alice", **kwargs: object) -> scheduler_pb2_grpc.SchedulerStub:
        return scheduler_pb2_grpc.SchedulerStub(self.channel("scheduler", client, **kwargs))  # type: ignore[arg-type]


def edge_settings(infra: StrataSettings, pki: DevPki, tokens_file: Path, **extra: object) -> dict:
    return {**infra.model_dump(), "grpc_port": 0, "grpc_tls_cert": pki.server_cert, "grpc_tls_key": pki.server_key,
            "grpc_tokens_file": tokens_file, "grpc_reflection": False, "consumer_session_timeout_ms": 6000,
            "consumer_heartbeat_interval_ms": 1000, **extra}


class Outcomes:
    """Reads what became of submitted prompts: final rewards, and dead letters of the tiers' topics."""

    WATCHED = (topics.REWARDS_SCORED, topics.PROMPTS_LEVEL0, topics.PROMPTS_LEVEL1, topics.PROMPTS_LEVEL2,
               topics.ROLLOUTS_GENERATED)

    def __init__(self, infra: StrataSettings) -> None:
        dead_letters = [topics.Topic(f"{t.name}.dlq", t.message_type) for t in self.WATCHED]
        self.reader = TailReader(infra, [*self.WATCHED, *dead_letters], client_id=f"edge-{uuid.uuid4().hex[:6]}")
        self.reader.seek_to_end()
        self.finals: dict[str, int] = {}
        self.dead: set[str] = set()
        self.routed: set[str] = set()

    def poll(self) -> None:
        for topic, event in self.reader.poll(0.5):
            request_id = getattr(event, "request_id", "")
            if topic.name.endswith(".dlq"):
                self.dead.add(request_id or getattr(event, "prompt_hash", ""))
            elif topic is topics.REWARDS_SCORED and event.final:
                self.finals[request_id] = self.finals.get(request_id, 0) + 1
            elif topic in (topics.PROMPTS_LEVEL0, topics.PROMPTS_LEVEL1, topics.PROMPTS_LEVEL2):
                self.routed.add(request_id)

    def wait_served(self, request_ids: list[str], timeout_s: float = 240.0) -> None:
        """Every request got its final rewards and none was dead-lettered on the way."""
        deadline = time.monotonic() + timeout_s
        while not all(r in self.finals for r in request_ids):
            dead = [r for r in request_ids if r in self.dead]
            assert not dead, f"accepted, then dead-lettered: {dead}"
            assert time.monotonic() < deadline, f"not served in {timeout_s:.0f} s: " \
                f"{[r for r in request_ids if r not in self.finals]}"
            self.poll()
        assert not [r for r in request_ids if r in self.dead], "accepted, then dead-lettered"

    def close(self) -> None:
        self.reader.close()
