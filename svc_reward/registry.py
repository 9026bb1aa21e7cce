"""Registry of reward-model versions, in Redis: what svc_reward registers, and their calibrations (R7).

A version is content-addressed: ``<kind>-<first 12 hex of its checksum>``, where the checksum is
the SHA-256 of the members' weight files (``strata.contract.checksums.weights_checksum``). For one
light RM this is exactly the version ``svc_reward`` reports when started on that directory, so a
reward's ``rm_version`` names the same thing whichever way the model was loaded.

Redis keys (``prefix`` = ``strata:rm``):

    <prefix>:versions          ZSET  version -> registered_at (unix seconds)
    <prefix>:version:<v>       STRING  JSON of the RmVersion (path, members, checksum, metrics, ...)
    <prefix>:promoted          STRING  the light version promoted last
    <prefix>:promotions        LIST  JSON {version, at}, newest first

A light version's entry may carry its score calibration (``calibration``: the ``to_dict`` of a
``svc_reward.calibrate.ScoreCalibration`` fitted for its weights), the same one that lies beside
its weights (``svc_reward.calibration_store``) and that svc_reward serves with it.

svc_reward registers the RMs it starts with (:func:`register_served`). Listing and promotion are
the tools' (``strata_tools.rm.registry``, on these keys): ``promote`` publishes ``RewardModelUpdated``
on ``strata.rm.updated``, which every svc_reward replica follows (``svc_reward.rm_watch``) to swap
its light RM between two batches.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis

from strata.contract.checksums import version_id, weights_checksum
from svc_reward.calibrate import ScoreCalibration
from svc_reward.calibration_store import read_calibration

log = logging.getLogger(__name__)

KINDS: tuple[str, ...] = ("strong", "light")
DEFAULT_PREFIX = "strata:rm"


class RegistryError(Exception):
    """A registry operation that cannot be done; the message says why."""


class UnknownVersionError(RegistryError, KeyError):
    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown RM version"


@dataclass(frozen=True)
class RmVersion:
    version: str
    kind: str  # "strong" | "light"
    paths: tuple[str, ...]  # model directories; several for an ensemble (R8)
    checksum: str  # weights_checksum(paths)
    metrics: dict[str, float] = field(default_factory=dict)  # e.g. "spearman/strong_eval"
    parent: str | None = None  # the strong version a light one was distilled from
    config: dict[str, Any] = field(default_factory=dict)  # resolved training config
    registered_at: float = 0.0
    promoted_at: float | None = None
    calibration: dict[str, Any] | None = None  # ScoreCalibration.to_dict(), fitted for these weights (light only)

    @property
    def path(self) -> str:
        return self.paths[0]

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, default=str)

    @classmethod
    def from_json(cls, raw: str | bytes) -> RmVersion:
        data = json.loads(raw)
        data["paths"] = tuple(data["paths"])
        return cls(**data)


def describe(kind: str, paths: Sequence[str | Path], metrics: dict[str, float] | None = None,
             parent: str | None = None, config: dict[str, Any] | None = None) -> RmVersion:
    """A version entry for model directories on disk (checksum computed here)."""
    if kind not in KINDS:
        raise ValueError(f"unknown RM kind {kind!r}; use one of {', '.join(KINDS)}")
    if not paths:
        raise ValueError("a version needs at least one model directory")
    resolved = tuple(str(Path(p).expanduser().resolve()) for p in paths)
    checksum = weights_checksum(resolved)
    calibration = stored_calibration(resolved, checksum) if kind == "light" else None
    return RmVersion(version_id(kind, checksum), kind, resolved, checksum, dict(metrics or {}), parent,
                     dict(config or {}), calibration=calibration.to_dict() if calibration else None)


def stored_calibration(paths: Sequence[str], checksum: str) -> ScoreCalibration | None:
    """The calibration in the first directory of ``paths`` if it is valid and fitted for ``checksum``."""
    try:
        calibration = read_calibration(paths[0])
    except (OSError, ValueError) as exc:  # describing a version must not fail on a bad calibration file
        log.warning("calibration of %s left out: %s", paths[0], exc)
        return None
    return calibration if calibration is not None and calibration.checksum == checksum else None


def recorded_teacher(model_dir: str | Path) -> str | None:
    """The strong version a light RM directory says it was distilled from: ``teacher`` in a zoo model's
    ``strata_zoo.json``, ``parent`` in a ``strata rm distill`` version's ``strata_rm.json``."""
    for name, key in (("strata_zoo.json", "teacher"), ("strata_rm.json", "parent")):
        info_file = Path(model_dir) / name
        if info_file.is_file():
            try:
                value = json.loads(info_file.read_text()).get(key)
            except (OSError, ValueError):
                continue
            if isinstance(value, str) and value:
                return value
    return None


def register_served(registry: RmRegistry, light_paths: Sequence[str | Path], strong_path: str | Path | None) -> None:
    """Register the RMs a reward service starts with (idempotent), the light one with the strong
    version it was distilled from, so that ``strata rm list`` shows what is served and its teacher."""
    if strong_path is not None:
        registry.register(describe("strong", [strong_path], config={"source": "served at start"}))
    teacher = recorded_teacher(light_paths[0]) if len(light_paths) == 1 else None
    light = describe("light", light_paths, parent=teacher, config={"source": "served at start"})
    registered = registry.register(light)
    if light.calibration is not None and registered.calibration != light.calibration:
        # Registered before its calibration was written: the entry catches up with the file.
        registry.set_calibration(light.version, ScoreCalibration.from_dict(light.calibration))


class RmRegistry:
    """Versions registered and their calibrations, under ``prefix``; the tools list and promote them
    (``strata_tools.rm.registry.RmRegistryAdmin``)."""

    def __init__(self, client: redis.Redis, prefix: str = DEFAULT_PREFIX) -> None:
        self._redis = client
        self._prefix = prefix

    def _key(self, *parts: str) -> str:
        return ":".join((self._prefix, *parts))

    def register(self, entry: RmVersion) -> RmVersion:
        """Store ``entry`` (idempotent: registering the same version again keeps the first entry)."""
        stamped = RmVersion(**{**asdict(entry), "paths": entry.paths, "registered_at": time.time(),
                               "promoted_at": None})
        with self._redis.pipeline() as pipe:
            pipe.set(self._key("version", entry.version), stamped.to_json(), nx=True)
            pipe.zadd(self._key("versions"), {entry.version: stamped.registered_at}, nx=True)
            created, _ = pipe.execute()
        return stamped if created else self.get(entry.version)

    def get(self, version: str) -> RmVersion:
        raw = self._redis.get(self._key("version", version))
        if raw is None:
            raise UnknownVersionError(f"no RM version {version!r} in the registry (see `strata rm list`)")
        return RmVersion.from_json(raw)

    def set_calibration(self, version: str, calibration: ScoreCalibration) -> RmVersion:
        """Store ``calibration`` in the entry of the light ``version`` it was fitted for; the updated entry."""
        entry = self.get(version)
        if entry.kind != "light":
            raise RegistryError(f"{version} is a {entry.kind} RM: only a light RM's score is calibrated "
                                "(the escalation threshold applies to it)")
        if calibration.checksum != entry.checksum:
            raise RegistryError(f"the calibration was fitted for weights {calibration.checksum[:12] or '(unknown)'}, "
                                f"{version} has {entry.checksum[:12]}")
        stored = calibration.to_dict()
        return self._update(version, lambda e: RmVersion(**{**asdict(e), "paths": e.paths, "calibration": stored}))

    def _update(self, version: str, change: Callable[[RmVersion], RmVersion],
                also: Callable[[redis.client.Pipeline], None] | None = None) -> RmVersion:
        """Rewrite the entry of ``version`` as ``change`` makes it, retried if another writer changed
        it meanwhile: a promotion and a calibration written at once both stay. ``also`` queues more
        writes into the same transaction."""
        key = self._key("version", version)
        updated: list[RmVersion] = []

        def write(pipe: redis.client.Pipeline) -> None:
            raw = pipe.get(key)
            if raw is None:
                raise UnknownVersionError(f"no RM version {version!r} in the registry (see `strata rm list`)")
            entry = change(RmVersion.from_json(raw))
            pipe.multi()
            pipe.set(key, entry.to_json())
            if also is not None:
                also(pipe)
            updated[:] = [entry]

        self._redis.transaction(write, key)
        return updated[0]
