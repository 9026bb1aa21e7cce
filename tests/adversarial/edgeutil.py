"""The adversarial suite's helpers: the locked-down stack's handle and a reader of what became of
submitted prompts (final rewards, dead letters)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import grpc

from strata import rpc
from strata.config import StrataSettings
from strata.v1 import scheduler_pb2_grpc
from strata_tools.bench.edge import Outcomes as BenchOutcomes
from strata_tools.tlsgen import DevPki


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


class Outcomes(BenchOutcomes):
    """The bench's reader, with the suite's assertion: accepted means served, never dead-lettered."""

    def wait_served(self, request_ids: list[str], timeout_s: float = 240.0) -> None:
        dead, unsettled = self.settle(request_ids, timeout_s)
        assert not dead, f"accepted, then dead-lettered: {dead}"
        assert not unsettled, f"not served in {timeout_s:.0f} s: {unsettled}"
