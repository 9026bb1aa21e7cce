"""``python -m svc_generator --tier 1 --model PATH``: one generator deployment."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from strata import redis_client
from strata.bus import Publisher, Worker
from strata.content_store import ContentStore
from strata.contract.models import model_path
from strata.debug_store import debug_store_for
from strata.devicetime import device_clock
from strata.models.budget import TokenBudget
from strata.rpc import ServiceBinding
from strata.service import ServiceParts, service_main
from strata.v1 import generator_pb2, generator_pb2_grpc
from svc_generator.backends import create_backend, has_dropout
from svc_generator.batcher import DynamicBatcher
from svc_generator.config import GeneratorSettings
from svc_generator.policy_watch import PolicyWatcher
from svc_generator.servicer import GeneratorServicer
from svc_generator.worker import GeneratorWorker


def model_dir(settings: GeneratorSettings) -> str:
    """``--model``, else the built zoo's model of this tier (never built here: strata.contract.models)."""
    return model_path("level1" if settings.tier == 1 else "level2", settings.model, settings.cache_dir,
                      settings.zoo_preset, "--model (STRATA_MODEL)")


def build(settings: GeneratorSettings) -> ServiceParts:
    """Wire the service: backend, batcher, servicer, worker, policy watcher."""
    path = model_dir(settings)
    backend = create_backend(settings, path)
    budget = TokenBudget.of_model(f"Level-{settings.tier}", path)
    rollout_dropout_ok = settings.backend == "hf" and has_dropout(backend.lm.model)  # type: ignore[attr-defined]
    if settings.wants_rollout_dropout and not rollout_dropout_ok:  # by default only: create_backend said why
        settings = settings.model_copy(update={"rollout_dropout_enabled": False})
    batcher = DynamicBatcher(backend, settings.max_batch_size, settings.max_wait_ms / 1000, settings.policy_version,
                             clock=device_clock(backend.device))
    client = redis_client.connect(settings.redis_address, socket_timeout=10)
    store = ContentStore(client, settings.content_ttl_s, settings.content_max_bytes)
    publisher = Publisher(settings, client_id=f"svc-generator-l{settings.tier}")
    handler = GeneratorWorker(settings, batcher, store, client, publisher, backend.tokenizer_id,
                              debug_store_for(settings, client), n_params=backend.n_params, budget=budget,
                              rollout_dropout_ok=rollout_dropout_ok)
    worker = Worker(settings, settings.consumer_group, publisher=publisher,
                    batch_handlers={handler.topic: handler.handle_batch})
    loops = [batcher.run]
    if settings.follows_policy:
        loops.append(PolicyWatcher(settings, batcher, checkpoint_root=settings.policy_checkpoint_root,
                                   dead_letters=publisher).run)
    servicer = GeneratorServicer(settings, batcher, store, backend.tokenizer_id, budget, rollout_dropout_ok)
    binding = ServiceBinding(generator_pb2_grpc.add_GeneratorServicer_to_server, servicer,
                             generator_pb2.DESCRIPTOR.services_by_name["Generator"].full_name)
    return ServiceParts(f"svc_generator[l{settings.tier}]", settings, [binding], settings.resolved_grpc_port,
                        workers=[worker], loops=loops, on_stop=[publisher.close, client.close])


def main(argv: Sequence[str] | None = None) -> int:
    return service_main(GeneratorSettings, build, "python -m svc_generator", __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
