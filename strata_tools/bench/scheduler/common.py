"""What the scheduler bench's parts share: the timeouts, the wait for the statistics worker's committed
offsets, the encoder cache (``CachedEncoder``), a quieter engine log, the rule behind a routing decision's
reason (``rule_of``), the settings of a second routing run in this process (``side_run``) and the bench's
Redis client (``checked_redis``)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np

from strata.errors import CliError

if TYPE_CHECKING:
    import redis

    from strata.bus.admin import GroupLag
    from strata.service import RunningService
    from svc_scheduler.config import SchedulerSettings
    from svc_scheduler.encoder import Encoder

SYNC_TIMEOUT_S = 120.0  # one batch's rollouts or statistics taking longer means the stack is stuck
OFFSET_POLL_S = 0.02  # interval between reads of the statistics group's committed offsets


def wait_for_stats(lag: GroupLag, timeout_s: float, running: RunningService | None = None) -> None:
    """Until the statistics worker's group has folded in everything published so far."""
    def check() -> None:
        if running is not None and running.failures:
            raise CliError(f"the scheduler service failed: {running.failures[0]!r}")

    try:
        lag.wait_caught_up(timeout_s, check, OFFSET_POLL_S)
    except TimeoutError as exc:
        raise CliError(f"timed out: the scheduler's statistics worker is behind ({exc})") from exc


class CachedEncoder:
    """The real encoder, remembering vectors of texts it has seen (later passes cost no encoding)."""

    def __init__(self, encoder: Encoder) -> None:
        self._encoder = encoder
        self.dim = encoder.dim
        self.encoder_id = encoder.encoder_id
        self.n_params = encoder.n_params
        self.count_tokens = encoder.count_tokens
        self.clock = encoder.clock
        self.card = encoder.card  # a fine-tuned encoder's thresholds (build_parts applies them)
        self._cache: dict[str, np.ndarray] = {}

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        missing = [t for t in dict.fromkeys(texts) if t not in self._cache]
        if missing:
            for text, vector in zip(missing, self._encoder.encode(missing), strict=True):
                self._cache[text] = vector
        return np.stack([self._cache[t] for t in texts]) if texts else self._encoder.encode([])

    def encode_counted(self, texts: Sequence[str]) -> tuple[np.ndarray, list[int]]:
        return self.encode(texts), self.count_tokens(texts)

    def adopt(self, encoder_id: str) -> bool:
        changed = self._encoder.adopt(encoder_id)
        if changed:  # another vector space: nothing remembered holds
            self._cache.clear()
            self.encoder_id = self._encoder.encoder_id
        return changed


@contextlib.contextmanager
def quiet_logger(logger_name: str) -> Iterator[None]:
    """The engine logs every decision at INFO; thousands of lines would bury the progress lines."""
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(max(logging.WARNING, level))
    try:
        yield
    finally:
        logger.setLevel(level)


AUDITED = "audited skip -> Level-1"  # a would-be skip rolled out anyway (audit_share); a rollout
OWN_HISTORY = "own history -> skip"  # a skip on the prompt's own rewards (--error-anatomy: their policy's drift)
# The rule behind a decision, from the start of its reason (svc_scheduler/routing.py writes them).
_RULES = (("Level-2: high-risk topic", "risk topic -> Level-2"),
          ("Level-2: a response to this prompt was flagged unsafe", "flagged unsafe -> Level-2"),
          ("skip: this prompt has", OWN_HISTORY),
          ("Level-2 before generating", "Level-1's record -> Level-2"),
          ("Level-2:", "uncertain neighbourhood -> Level-2"),
          ("skip: close paraphrases", "close paraphrases -> skip"),
          ("skip:", "known neighbourhood -> skip"),
          ("Level-1 (audit", AUDITED),
          ("Level-1:", "too little known -> Level-1"))


def rule_of(reason: str) -> str:
    return next((name for prefix, name in _RULES if reason.startswith(prefix)), "other")


# the --live subset's run, --compare-cluster-marking, --compare-encoder's arms
SIDE_RUNS = ("sub", "flip", "enc", "floor", "later-base", "later-enc")


def side_run(settings: SchedulerSettings, side: str, **changes: object) -> SchedulerSettings:
    """Settings for a second routing run in this process: its own Redis keys and statistics group."""
    return settings.model_copy(update={"redis_prefix": f"{settings.redis_prefix}-{side}",
                                       "stats_group_id": f"{settings.stats_group_id}-{side}", **changes})


def checked_redis(settings: SchedulerSettings) -> redis.Redis:
    """The bench's Redis client (a long timeout: a shared 2-core machine stalls), or a CliError."""
    from svc_scheduler.store import connect

    client = connect(settings.model_copy(update={"redis_timeout_s": 30.0}))
    try:
        client.ping()
    except Exception as exc:
        raise CliError(f"Redis at {settings.redis_address_masked} does not answer: {exc}") from exc
    return client
