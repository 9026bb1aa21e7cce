"""``python -m svc_probe``: the Level-0 probe service."""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence

import redis
from prometheus_client import Counter, Histogram

from strata.bus import Publisher, Worker, topics
from strata.content_store import ContentStore
from strata.contract.models import model_path
from strata.devicetime import device_clock
from strata.models.loading import LoadedModel, load_causal_lm
from strata.rpc import ServiceBinding
from strata.service import ServiceParts, service_main
from strata.v1 import probe_pb2, probe_pb2_grpc
from svc_probe.config import ProbeSettings
from svc_probe.core import ProbeResult, ProbeRules, probe
from svc_probe.servicer import ProbeServicer
from svc_probe.worker import ProbeFn, ProbeWorker

PROBE_SECONDS = Histogram("strata_probe_batch_seconds", "Probe forward time per batch (R1 budget: 50 ms/prompt)",
                          buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1))
CAUTIONS = Counter("strata_probe_cautions_total", "Prompts the probe sent to Level-2 (risk or low confidence)")


def make_probe_fn(settings: ProbeSettings) -> tuple[ProbeFn, LoadedModel]:
    """The probe as a function of prompts (thread-safe), and its model."""
    path = model_path("probe", settings.model, settings.cache_dir, settings.zoo_preset, "--model (STRATA_MODEL)")
    lm = load_causal_lm(path, device=settings.device, dtype=settings.dtype)
    rules = ProbeRules(settings.top_k, settings.min_confidence, settings.risk_threshold, settings.keywords())
    lock = threading.Lock()  # one forward at a time: gRPC threads and the worker share the model

    def probe_fn(prompts: Sequence[str]) -> list[ProbeResult]:
        with lock, PROBE_SECONDS.time():
            results = probe(lm, prompts, rules, settings.max_prompt_tokens)
        CAUTIONS.inc(sum(r.caution for r in results))
        return results

    return probe_fn, lm


def build(settings: ProbeSettings) -> ServiceParts:
    probe_fn, lm = make_probe_fn(settings)
    client = redis.Redis.from_url(settings.redis_address, socket_timeout=10)
    store = ContentStore(client, settings.content_ttl_s, settings.content_max_bytes)
    publisher = Publisher(settings, client_id="svc-probe")
    handler = ProbeWorker(probe_fn, store, publisher, client, lm.n_params, settings.content_ttl_s,
                          device_clock(lm.device))
    worker = Worker(settings, settings.group_id, publisher=publisher,
                    batch_handlers={topics.PROMPTS_LEVEL0: handler.handle_batch})
    servicer = ProbeServicer(probe_fn, settings.max_prompt_chars, settings.top_k)
    binding = ServiceBinding(probe_pb2_grpc.add_ProbeServicer_to_server, servicer,
                             probe_pb2.DESCRIPTOR.services_by_name["Probe"].full_name)
    return ServiceParts("svc_probe", settings, [binding], settings.grpc_port, workers=[worker],
                        on_stop=[publisher.close, client.close])


def main(argv: Sequence[str] | None = None) -> int:
    return service_main(ProbeSettings, build, "python -m svc_probe", __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
