"""The one canonical content hash of Strata.

Prompts and responses are identified everywhere (Kafka keys, Redis keys, the rollout log) by the
SHA-256 of their UTF-8 bytes after Unicode NFC normalisation, and nothing else: no case folding,
no whitespace trimming, because "Explain X" and "explain x " may deserve different rewards.
NFC only removes differences that no reader can see (precomposed vs combining accents).
"""

from __future__ import annotations

import hashlib
import unicodedata

HASH_HEX_LENGTH = 64


class InvalidTextError(ValueError):
    """Text that cannot be hashed: not a str, or not encodable as UTF-8 (lone surrogates)."""


def normalise(text: str) -> str:
    """Document normalisation: Unicode NFC, no other change."""
    if not isinstance(text, str):
        raise InvalidTextError(f"expected str, got {type(text).__name__}")
    return unicodedata.normalize("NFC", text)


def encode_utf8(text: str) -> bytes:
    """NFC-normalised UTF-8 bytes of ``text``; a clear error for lone surrogates."""
    try:
        return normalise(text).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidTextError(f"text is not valid Unicode (position {exc.start}: {exc.reason})") from exc


def content_hash(text: str) -> str:
    """Hex SHA-256 of the NFC-normalised UTF-8 text."""
    return hashlib.sha256(encode_utf8(text)).hexdigest()


def decode_utf8(data: bytes, field: str = "text") -> str:
    """Decode bytes from the outside world; a clear error naming ``field`` for invalid UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidTextError(f"{field} is not valid UTF-8 (byte {exc.start}: {exc.reason})") from exc


def is_content_hash(value: str) -> bool:
    """True for a well-formed hash (64 lowercase hex digits)."""
    return len(value) == HASH_HEX_LENGTH and all(c in "0123456789abcdef" for c in value)


def stable_fraction(text: str) -> float:
    """A uniform number in [0, 1) fixed by ``text`` (the first 8 bytes of the SHA-256 of its UTF-8
    bytes, no normalisation): a draw that every replica and every redelivery makes the same way."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big") / 2**64
