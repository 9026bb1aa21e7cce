"""A live stack with the edge locked down, for the adversarial suite.

Scheduler, probe, both generators and the reward service run in-process on free ports, against the
session's real Kafka and Redis, with TLS (a private CA from ``strata tls init``'s code) and bearer
tokens on every gRPC service. Limits are small so that the suite can reach them quickly: two threads
for unary calls, four Watch slots (two per client), a Submit rate of 1 prompt/s with a burst of 100
(each client's cases fit in its burst; the flood test exhausts one).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from adversarial.edgeutil import Edge, Outcomes, edge_settings
from strata.bus import topics
from strata.bus.admin import start_group_at_end
from strata.config import StrataSettings
from strata.rpc_auth import new_token, token_line
from strata.service import RunningService, ServiceParts, start_service, stop_service
from strata_tools.tlsgen import init_dev_pki

CLIENTS = ("alice", "bob", "carol", "dave", "erin")


@pytest.fixture(scope="package")
def edge(infra: StrataSettings, zoo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edge]:
    from svc_generator.__main__ import build as build_generator
    from svc_generator.config import GeneratorSettings
    from svc_probe.__main__ import build as build_probe
    from svc_probe.config import ProbeSettings
    from svc_reward.__main__ import build as build_reward
    from svc_reward.config import RewardSettings
    from svc_scheduler.__main__ import build_parts
    from svc_scheduler.config import SchedulerSettings

    directory = tmp_path_factory.mktemp("edge")
    pki = init_dev_pki(directory / "pki")
    tokens = {name: new_token() for name in CLIENTS}
    tokens_file = directory / "tokens"
    tokens_file.write_text("".join(token_line(name, token) + "\n" for name, token in tokens.items()))

    def settings(**extra: object) -> dict:
        return edge_settings(infra, pki, tokens_file, **extra)

    scheduler_settings = SchedulerSettings(**settings(
        redis_prefix=f"test:edge:{uuid.uuid4().hex[:8]}", stats_group_id=f"test-edge-stats-{uuid.uuid4().hex[:8]}",
        watch_lookback_s=30.0, audit_share=0.0, level1_model=str(zoo.level1), level2_model=str(zoo.level2),
        grpc_max_workers=2, max_watch_streams=4, max_watch_streams_per_client=2,
        submit_rate_per_client=1.0, submit_burst_per_client=100, max_batch_size=8,
    ))
    start_group_at_end(infra, scheduler_settings.stats_group_id, [topics.REWARDS_SCORED])
    scheduler_parts, _engine = build_parts(scheduler_settings)
    parts: dict[str, ServiceParts] = {
        "scheduler": scheduler_parts,
        "probe": build_probe(ProbeSettings(**settings(model=str(zoo.probe), device="cpu"))),
        "level1": build_generator(GeneratorSettings(**settings(tier=1, model=str(zoo.level1), device="cpu",
                                                               max_new_tokens=24))),
        "level2": build_generator(GeneratorSettings(**settings(tier=2, model=str(zoo.level2), device="cpu",
                                                               max_new_tokens=24))),
        "reward": build_reward(RewardSettings(**settings(light_rm=str(zoo.light_rm), strong_rm=str(zoo.strong_rm),
                                                         device="cpu"))),
    }
    running: dict[str, RunningService] = {}
    made = None
    try:
        for name, service in parts.items():
            running[name] = start_service(service)
        made = Edge(infra, pki, tokens, {name: r.port for name, r in running.items()}, scheduler_settings,
                    scheduler_parts.bindings[0].servicer)
        yield made
    finally:
        for channel in made.channels if made else ():
            channel.close()
        for name, r in running.items():
            stop_service(parts[name], r, grace_s=0)


@pytest.fixture
def outcomes(edge: Edge) -> Iterator[Outcomes]:
    reader = Outcomes(edge.infra)
    yield reader
    reader.close()
