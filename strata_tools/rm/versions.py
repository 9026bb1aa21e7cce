"""RM versions: artifact directories, the Redis registry, what is served and promotion (R7).

A version is a directory ``<cache_dir>/rm/<version>/`` (one ``save_pretrained`` directory, or
``member-<i>`` directories for an ensemble) with ``strata_rm.json`` (kind, version, checksum,
metrics, the resolved config, data sources), registered in Redis (``svc_reward.registry``; listed and
promoted through ``strata_tools.rm.registry``). Promotion publishes ``strata.rm.updated``; every
svc_reward replica swaps between batches.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis

from strata import redis_client
from strata.bus import Publisher, PublishError
from strata.contract.checksums import version_id, weights_checksum
from strata.errors import CliError
from strata_tools.rm.models import ZooSource

RM_INFO_FILE = "strata_rm.json"


def open_registry(settings: Any) -> Any:
    """The registry on the configured Redis, or a CliError saying how to get one."""
    from strata_tools.rm.registry import RmRegistryAdmin

    client = redis_client.connect(settings.redis_address, socket_timeout=5, socket_connect_timeout=5)
    try:
        client.ping()
    except redis.RedisError as exc:
        client.close()
        raise CliError(f"Redis at {settings.redis_address_masked} does not answer ({exc}): run `strata infra up`, set "
                       "STRATA_REDIS_URL, or pass --no-register") from exc
    return RmRegistryAdmin(client)


def finalize_version(staging: Path, members: Sequence[Path], kind: str, out: Path | None, settings: Any,
                     info: dict[str, Any]) -> Any:
    """Move ``staging`` to its final directory, named by the version, and write ``strata_rm.json``.

    Returns the ``RmVersion`` describing the final directories.
    """
    from svc_reward.registry import describe

    version = version_id(kind, weights_checksum(members))
    target = out or Path(settings.cache_dir).expanduser() / "rm" / version
    if target.exists():
        if not (target / RM_INFO_FILE).is_file():
            raise CliError(f"{target} exists and is not an RM version directory; pass another --out")
        shutil.rmtree(target)  # same version (same weights) built again
    target.parent.mkdir(parents=True, exist_ok=True)
    staging.rename(target)
    final_members = [target / m.relative_to(staging) for m in members]
    entry = describe(kind, final_members, info.get("metrics"), info.get("parent"), info.get("config"))
    (target / RM_INFO_FILE).write_text(json.dumps({**info, "kind": kind, "version": entry.version,
                                                   "checksum": entry.checksum, "paths": list(entry.paths)},
                                                  indent=2, sort_keys=True, default=str))
    return entry


def serving_light(registry: Any, zoo: ZooSource) -> tuple[str, list[Path]]:
    """The light RM svc_reward serves: the version promoted last, else the zoo's (its default)."""
    promoted = registry.promoted() if registry is not None else None
    if promoted:
        return promoted, [Path(p) for p in registry.get(promoted).paths]
    from svc_reward.registry import describe

    path = zoo.models().rm_light
    return describe("light", [path]).version, [path]


def promote_version(registry: Any, settings: Any, version: str, verify: bool) -> None:
    from svc_reward.registry import RegistryError

    try:
        publisher = Publisher(settings, client_id="strata-rm-promote")
    except Exception as exc:  # kafka-python raises NoBrokersAvailable and friends
        raise CliError(f"Kafka at {settings.kafka_address} does not answer ({exc}): run `strata infra up`") from exc
    try:
        event = registry.promote(version, publisher, verify=verify)
    except RegistryError as exc:
        raise CliError(str(exc)) from exc
    except PublishError as exc:
        raise CliError(f"the promotion was not acknowledged by Kafka: {exc}") from exc
    finally:
        publisher.close()
    print(f"promoted {event.rm_version}: svc_reward replicas swap to it between batches "
          f"({len(event.ensemble_paths)} member(s), checksum {event.checksum[:12]})")


def version_table(entries: Sequence[Any], promoted: str | None) -> list[str]:
    """``strata rm list``'s table: one line per version, the promoted one starred."""
    lines = [f"  {'version':20s} {'kind':6s} {'registered':19s} {'members':>7s} {'spearman/strong':>15s} "
             f"{'spearman/oracle':>15s}  {'distilled from':20s} path"]
    for e in entries:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.registered_at))
        vs_strong = _fmt(e.metrics.get("spearman/strong_eval"))
        vs_oracle = _fmt(e.metrics.get("spearman/oracle_eval"))
        lines.append(f"{'*' if e.version == promoted else ' '} {e.version:20s} {e.kind:6s} {when:19s} "
                     f"{len(e.paths):>7d} {vs_strong:>15s} {vs_oracle:>15s}  {e.parent or '-':20s} {e.path}")
    if promoted:
        lines.append(f"* promoted last (what svc_reward serves): {promoted}")
    return lines


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
