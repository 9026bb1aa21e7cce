"""Content-addressed store of texts and token ids, in Redis.

Services exchange hashes over Kafka; texts and token ids live here, keyed by the canonical content
hash (``strata.hashing``). Writes are idempotent (same text, same key) and atomic (text and token
ids of one item are written in one MULTI/EXEC, so a reader never sees half an item). Everything
expires after a TTL; oversize items are refused with a clear error before anything is written.

Keys:
    strata:content:text:<hash>                 UTF-8 text
    strata:content:tokens:<tokenizer>:<hash>   token ids, little-endian uint32
"""

from __future__ import annotations

import array
import sys
from collections.abc import Sequence
from typing import cast

import redis

from strata import redis_client
from strata.hashing import content_hash, encode_utf8

_TEXT_PREFIX = "strata:content:text:"
_TOKENS_PREFIX = "strata:content:tokens:"


class ContentStoreError(Exception):
    """Base class of content-store errors."""


class ContentTooLargeError(ContentStoreError, ValueError):
    """An item is larger than the configured limit (``STRATA_CONTENT_MAX_BYTES``)."""


class ContentNotFoundError(ContentStoreError, KeyError):
    """No item under that hash: never stored, or expired."""

    def __str__(self) -> str:  # KeyError would print the repr of its argument
        return str(self.args[0]) if self.args else "content not found"


class StoreUnavailableError(ContentStoreError, ConnectionError):
    """Redis did not answer."""


def _pack_token_ids(token_ids: Sequence[int]) -> bytes:
    packed = array.array("I", token_ids)  # uint32: any real vocabulary fits
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tobytes()


def _unpack_token_ids(data: bytes) -> list[int]:
    unpacked = array.array("I")
    unpacked.frombytes(data)
    if sys.byteorder != "little":
        unpacked.byteswap()
    return unpacked.tolist()


class ContentStore:
    """Put and get texts and token ids by content hash."""

    def __init__(self, client: redis.Redis, ttl_s: int, max_bytes: int) -> None:
        self._redis = client
        self._ttl_s = ttl_s
        self._max_bytes = max_bytes

    @classmethod
    def from_url(cls, url: str, ttl_s: int, max_bytes: int) -> ContentStore:
        return cls(redis_client.connect(url, socket_timeout=5, socket_connect_timeout=5), ttl_s, max_bytes)

    def _check_size(self, what: str, size: int) -> None:
        if size > self._max_bytes:
            raise ContentTooLargeError(
                f"{what} is {size} bytes, over the content store's limit of {self._max_bytes} bytes "
                "(raise STRATA_CONTENT_MAX_BYTES if this is intended)"
            )

    def put(
        self, text: str, token_ids: Sequence[int] | None = None, tokenizer_id: str = "default"
    ) -> str:
        """Store ``text`` (and its token ids) and return its hash. Idempotent; all or nothing."""
        data = encode_utf8(text)
        self._check_size("text", len(data))
        packed = None
        if token_ids is not None:
            if any(not 0 <= t < 2**32 for t in token_ids):
                raise ValueError("token ids must be integers in [0, 2^32)")
            packed = _pack_token_ids(token_ids)
            self._check_size("token ids", len(packed))
        digest = content_hash(text)
        try:
            with self._redis.pipeline(transaction=True) as pipe:
                pipe.set(_TEXT_PREFIX + digest, data, ex=self._ttl_s)
                if packed is not None:
                    pipe.set(f"{_TOKENS_PREFIX}{tokenizer_id}:{digest}", packed, ex=self._ttl_s)
                pipe.execute()
        except redis.ConnectionError as exc:
            raise StoreUnavailableError(f"content store (Redis) unavailable: {exc}") from exc
        return digest

    def put_tokens(self, digest: str, token_ids: Sequence[int], tokenizer_id: str = "default") -> None:
        """Attach token ids to an already stored text."""
        packed = _pack_token_ids(token_ids)
        self._check_size("token ids", len(packed))
        try:
            self._redis.set(f"{_TOKENS_PREFIX}{tokenizer_id}:{digest}", packed, ex=self._ttl_s)
        except redis.ConnectionError as exc:
            raise StoreUnavailableError(f"content store (Redis) unavailable: {exc}") from exc

    def _get(self, key: str) -> bytes | None:
        try:
            return cast("bytes | None", self._redis.get(key))
        except redis.ConnectionError as exc:
            raise StoreUnavailableError(f"content store (Redis) unavailable: {exc}") from exc

    def get_text(self, digest: str) -> str:
        data = self._get(_TEXT_PREFIX + digest)
        if data is None:
            raise ContentNotFoundError(f"no text under hash {digest} (never stored, or expired)")
        return data.decode("utf-8")

    def find_texts(self, digests: Sequence[str]) -> dict[str, str]:
        """The stored texts among ``digests`` by hash, in one round trip (a missing one is left out)."""
        unique = list(dict.fromkeys(digests))
        if not unique:
            return {}
        try:
            found = cast("list[bytes | None]", self._redis.mget([_TEXT_PREFIX + d for d in unique]))
        except redis.ConnectionError as exc:
            raise StoreUnavailableError(f"content store (Redis) unavailable: {exc}") from exc
        return {d: data.decode("utf-8") for d, data in zip(unique, found, strict=True) if data is not None}

    def get_texts(self, digests: Sequence[str]) -> list[str]:
        """The texts of ``digests``, in order, in one round trip (a batch's prompts and responses)."""
        found = self.find_texts(digests)
        for digest in digests:
            if digest not in found:
                raise ContentNotFoundError(f"no text under hash {digest} (never stored, or expired)")
        return [found[d] for d in digests]

    def get_tokens(self, digest: str, tokenizer_id: str = "default") -> list[int]:
        data = self._get(f"{_TOKENS_PREFIX}{tokenizer_id}:{digest}")
        if data is None:
            raise ContentNotFoundError(
                f"no token ids under hash {digest} for tokenizer {tokenizer_id!r} (never stored, or expired)"
            )
        return _unpack_token_ids(data)

    def contains(self, digest: str) -> bool:
        try:
            return bool(self._redis.exists(_TEXT_PREFIX + digest))
        except redis.ConnectionError as exc:
            raise StoreUnavailableError(f"content store (Redis) unavailable: {exc}") from exc
