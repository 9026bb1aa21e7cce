"""The reward-model lifecycle's shared ground (R5-R8): the pairs files it reads, the evaluation sets and
prompt swaps, RM scores with their disk cache, and the logged rollouts of the rollout log. Training the
strong RM is ``strata_tools.rm.strong``, distilling a light RM ``strata_tools.rm.light``; ``strata rm``
(argparse and printing), ``strata bench rm`` and the RM loop call them; versions, the registry and
promotion are ``strata_tools.rm.versions``.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kafka.errors import KafkaError

from strata.bus import topics
from strata.bus.scan import TopicScan, newest_of
from strata.content_store import ContentNotFoundError, ContentStore, StoreUnavailableError
from strata.contract.checksums import weights_checksum
from strata.errors import CliError
from strata.jsonl import read_jsonl
from strata_tools.task.corpus import prompt_swaps, rm_pairs
from strata_tools.task.oracle import oracle_score
from strata_tools.task.suite import load_suite

log = logging.getLogger(__name__)

EVAL_SEED = 7  # synthetic (prompt, response) pairs of the eval and fresh splits, one per prompt
EVAL_SPLITS: tuple[str, ...] = ("eval", "fresh")


def read_pairs(path: Path, need_score: bool) -> list[dict[str, Any]]:
    """Rows of a JSONL file of {prompt, response[, score]}, checked line by line. An empty response is a row: a
    model that stops at once wrote it, the reward service scores it, and people score it (low)."""
    rows: list[dict[str, Any]] = []
    for number, row in read_jsonl(path):
        if not isinstance(row, dict):
            raise CliError(f"{path}:{number}: expected an object with prompt and response")
        if not isinstance(row.get("prompt"), str) or not row["prompt"].strip():
            raise CliError(f"{path}:{number}: 'prompt' must be a non-empty string")
        if not isinstance(row.get("response"), str):
            raise CliError(f"{path}:{number}: 'response' must be a string (empty for an answer that stopped at once)")
        if need_score:
            score = row.get("score")
            if not isinstance(score, int | float) or not 0.0 <= float(score) <= 5.0:
                raise CliError(f"{path}:{number}: 'score' must be a number in [0, 5], got {score!r}")
        rows.append(row)
    if not rows:
        raise CliError(f"{path} holds no pairs")
    return rows


def eval_sets(seed: int = EVAL_SEED) -> dict[str, tuple[list[str], list[str], list[float]]]:
    """Per held-out split: prompts, synthetic responses of mixed quality, and their oracle scores."""
    sets = {}
    for split in EVAL_SPLITS:
        pairs = rm_pairs(load_suite(split), 1, seed)
        sets[split] = ([p.record.text for p in pairs], [p.response for p in pairs],
                       [oracle_score(p.record, p.response) for p in pairs])
    return sets


def score_logits(rm: Any, prompts: Sequence[str], responses: Sequence[str], max_length: int, desc: str,
                 cache_dir: Path | None = None, batch_size: int = 32) -> Any:
    """RM logits (N, bins) for the pairs, in length order with a progress bar; cached on disk by
    (weights checksum, max_length, texts) when ``cache_dir`` is given."""
    import torch

    from strata_tools.rm.recipe import score_in_length_order

    cache_file = None
    if cache_dir is not None:
        digest = hashlib.sha256(f"{weights_checksum([rm.path])}:{max_length}".encode())
        for prompt, response in zip(prompts, responses, strict=True):
            digest.update(prompt.encode() + b"\0" + response.encode() + b"\1")
        cache_file = Path(cache_dir) / f"{digest.hexdigest()[:24]}.pt"
        if cache_file.is_file():
            return torch.load(cache_file)
    logits = score_in_length_order(rm, prompts, responses, max_length, desc, batch_size)
    if cache_file is not None:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        torch.save(logits, cache_file)
    return logits


def mean_rewards(rms: Sequence[Any], prompts: Sequence[str], responses: Sequence[str], max_length: int,
                 desc: str, temperature: float = 1.0) -> list[float]:
    """Rewards of the pairs under an RM or ensemble as svc_reward serves them (R8): the mean of the
    members' expected scores at the scoring ``temperature``."""
    import torch

    from svc_reward.scoring import tempered_reward

    return torch.stack([tempered_reward(score_logits(rm, prompts, responses, max_length, desc), temperature)
                        for rm in rms]).mean(dim=0).tolist()


class SourceUnavailableError(Exception):
    """Kafka or Redis could not be read; historical rollouts are skipped."""


def historical_rollouts(settings: Any, limit: int, timeout_s: float = 30.0) -> tuple[list[dict[str, Any]], int]:
    """The newest ``limit`` distinct (prompt, response) pairs of the rollout log, with their texts from
    the content store. Returns the rows and how many were logged but have expired from the store."""
    logged: dict[tuple[str, str], float] = {}
    if limit > 0:
        try:
            with TopicScan(settings, client_id="strata-rm", idle_timeout_s=timeout_s) as scan:
                bounds = scan.bounds(topics.ROLLOUT_LOG.name, required=False)
                newest = newest_of(bounds, max(1, limit // max(1, len(bounds))))
                for delivery in scan.events(topics.ROLLOUT_LOG, bounds=newest):
                    logged[(delivery.message.prompt_hash, delivery.message.response_hash)] = delivery.message.reward
        except (CliError, KafkaError) as exc:
            raise SourceUnavailableError(f"rollout log on {settings.kafka_address}: {exc}") from exc
    store = ContentStore.from_url(settings.redis_address, settings.content_ttl_s, settings.content_max_bytes)
    rows, expired = [], 0
    try:
        for (prompt_hash, response_hash), reward in list(logged.items())[-limit:]:
            try:
                prompt, response = store.get_text(prompt_hash), store.get_text(response_hash)
            except ContentNotFoundError:
                expired += 1
                continue
            rows.append({"prompt_hash": prompt_hash, "response_hash": response_hash, "prompt": prompt,
                         "response": response, "logged_reward": reward})
    except StoreUnavailableError as exc:
        raise SourceUnavailableError(f"content store at {settings.redis_address_masked}: {exc}") from exc
    return rows, expired


def rollout_rows(settings: Any, limit: int) -> tuple[list[dict[str, Any]], str]:
    """Historical rollouts, or none with a line saying why."""
    try:
        rows, expired = historical_rollouts(settings, limit)
    except SourceUnavailableError as exc:
        return [], f"rollout log skipped ({exc})"
    return rows, f"rollout log: {len(rows)} pairs ({expired} expired from the content store)"


def eval_swaps(split: str = "eval", seed: int = EVAL_SEED) -> tuple[list[str], list[str], list[str]]:
    """Prompt swaps of a held-out split: responses, their own prompts, other prompts (prompt match)."""
    records = load_suite(split)
    swaps = prompt_swaps(records, seed, records)
    return [s.response for s in swaps], [s.record.text for s in swaps], [s.other.text for s in swaps]
