"""``python -m svc_reward``: the reward service."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

import redis

from strata import redis_client
from strata.bus import Publisher, Worker, topics
from strata.content_store import ContentStore
from strata.contract.models import model_path
from strata.rpc import ServiceBinding
from strata.service import ServiceParts, service_main
from strata.v1 import reward_pb2, reward_pb2_grpc
from svc_reward.config import RewardSettings
from svc_reward.models import RewardModels, ScoringOptions
from svc_reward.registry import RmRegistry, register_served
from svc_reward.rm_watch import RmWatcher
from svc_reward.servicer import RewardServicer
from svc_reward.worker import RewardWorker

logger = logging.getLogger(__name__)


def model_paths(settings: RewardSettings) -> tuple[list[str], str]:
    """The light RM directories (ensemble members) and the strong RM directory: set, else the built zoo's."""
    light = model_path("rm_light", settings.light_rm, settings.cache_dir, settings.zoo_preset,
                       "--light-rm (STRATA_LIGHT_RM)")
    strong = model_path("rm_strong", settings.strong_rm, settings.cache_dir, settings.zoo_preset,
                        "--strong-rm (STRATA_STRONG_RM)")
    return [p.strip() for p in light.split(",") if p.strip()], strong


def load_models(settings: RewardSettings, light: list[str], strong: str) -> RewardModels:
    return RewardModels(light, strong, ScoringOptions.of(settings), settings.light_rm_version,
                        settings.strong_rm_version)


def build(settings: RewardSettings) -> ServiceParts:
    # Said once and plainly: whether Level-2 is the large model alone or the large model plus humans (R3).
    awaiting, why = settings.level2_humans()
    (logger.info if awaiting else logger.warning)(why)
    settings = settings.model_copy(update={"await_annotation": awaiting})
    light, strong = model_paths(settings)
    models = load_models(settings, light, strong)
    logger.info(settings.threshold_served(models.light_calibration))
    client = redis_client.connect(settings.redis_address, socket_timeout=10)
    try:
        register_served(RmRegistry(client), light, strong)
    except (redis.RedisError, OSError) as exc:  # the registry is for people; serving does not need it
        logger.warning("could not register the served RM versions: %s", exc)
    store = ContentStore(client, settings.content_ttl_s, settings.content_max_bytes)
    publisher = Publisher(settings, client_id="svc-reward")
    handler = RewardWorker(settings, models, store, client, publisher)
    worker = Worker(settings, settings.group_id, publisher=publisher,
                    batch_handlers={topics.ROLLOUTS_GENERATED: handler.handle_batch})
    servicer = RewardServicer(models, settings.max_items_per_request, settings.max_text_chars)
    binding = ServiceBinding(reward_pb2_grpc.add_RewardServicer_to_server, servicer,
                             reward_pb2.DESCRIPTOR.services_by_name["Reward"].full_name)
    loops = []
    if settings.rm_watch:
        # Hot swap (R7): load the newest promoted light RM before the first batch, then follow.
        watcher = RmWatcher(settings, models, settings.rm_verify_checksum, model_root=settings.rm_model_root,
                            dead_letters=publisher, threshold_served=settings.threshold_served)
        watcher.connect()
        watcher.catch_up()
        loops.append(watcher.run)
    return ServiceParts("svc_reward", settings, [binding], settings.grpc_port, workers=[worker], loops=loops,
                        on_stop=[publisher.close, client.close])


def main(argv: Sequence[str] | None = None) -> int:
    return service_main(RewardSettings, build, "python -m svc_reward", __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
