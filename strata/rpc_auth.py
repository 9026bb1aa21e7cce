"""Bearer tokens, one per client, on every gRPC service (docs/security.md).

The token file (``grpc_tokens_file``) holds one ``<client> <token>`` line per client; the token may
be written as ``sha256:<hex digest>`` so that the file on the server never holds a usable secret.
``strata token new <client>`` makes a token and its line. A call without a known token is answered
``UNAUTHENTICATED`` before any handler runs; the health service is exempt unless
``grpc_auth_health`` is set (probes and load balancers carry no tokens, and health reveals nothing).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

log = logging.getLogger(__name__)

AUTHORIZATION = "authorization"
BEARER = "bearer "
DIGEST_PREFIX = "sha256:"
MIN_TOKEN_CHARS = 16  # a short token is guessable; strata token new makes 43
HEALTH_SERVICE = "grpc.health.v1.Health"


class TokenFileError(ValueError):
    """The token file cannot be used; the message names the line."""


def digest_of(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


def new_token() -> str:
    return secrets.token_urlsafe(32)


@dataclass(frozen=True)
class TokenTable:
    """Known clients by the SHA-256 of their token."""

    clients: tuple[tuple[bytes, str], ...]

    @classmethod
    def parse(cls, lines: Iterable[str], source: str = "tokens") -> TokenTable:
        clients: list[tuple[bytes, str]] = []
        names: set[str] = set()
        for number, raw in enumerate(lines, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split()
            if len(parts) != 2:
                raise TokenFileError(f"{source}:{number}: expected '<client> <token>', got {len(parts)} fields")
            name, token = parts
            if name in names:
                raise TokenFileError(f"{source}:{number}: client {name!r} appears twice")
            if token.startswith(DIGEST_PREFIX):
                try:
                    digest = bytes.fromhex(token[len(DIGEST_PREFIX):])
                except ValueError as exc:
                    raise TokenFileError(f"{source}:{number}: {DIGEST_PREFIX} must be followed by hex") from exc
                if len(digest) != 32:
                    raise TokenFileError(f"{source}:{number}: a SHA-256 digest is 64 hex digits")
            elif len(token) < MIN_TOKEN_CHARS:
                raise TokenFileError(f"{source}:{number}: the token of {name!r} is shorter than {MIN_TOKEN_CHARS} "
                                     "characters; make one with `strata token new`")
            else:
                digest = digest_of(token)
            names.add(name)
            clients.append((digest, name))
        if not clients:
            raise TokenFileError(f"{source}: no clients; every call would be refused")
        return cls(tuple(clients))

    @classmethod
    def load(cls, path: Path) -> TokenTable:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise TokenFileError(f"cannot read the gRPC tokens file {path}: {exc.strerror}") from exc
        return cls.parse(text.splitlines(), str(path))

    def client_of(self, token: str) -> str | None:
        """The client ``token`` belongs to, or None. Every entry is compared, in constant time."""
        presented = digest_of(token)
        found = None
        for digest, name in self.clients:
            if hmac.compare_digest(presented, digest):
                found = name
        return found


def bearer_of(metadata: Iterable[tuple[str, Any]] | None) -> str | None:
    for key, value in metadata or ():
        if key == AUTHORIZATION and isinstance(value, str) and value[: len(BEARER)].lower() == BEARER:
            return value[len(BEARER):].strip()
    return None


def _denial(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same kind as ``handler`` that answers UNAUTHENTICATED."""

    def deny(_request: Any, context: grpc.ServicerContext) -> Any:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(deny)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(deny)
    if handler.stream_stream is not None:
        return grpc.stream_stream_rpc_method_handler(deny)
    return grpc.unary_unary_rpc_method_handler(deny)


class BearerTokenInterceptor(grpc.ServerInterceptor):
    """Refuses calls without a known bearer token, before the request is even parsed."""

    def __init__(self, tokens: TokenTable, exempt_services: Iterable[str] = (HEALTH_SERVICE,)) -> None:
        self.tokens = tokens
        self.exempt = tuple(f"/{name}/" for name in exempt_services)

    def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Any],
                          handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(self.exempt):
            return handler
        token = bearer_of(handler_call_details.invocation_metadata)
        if token is None:
            return _denial(handler, "this server needs a bearer token: send 'authorization: Bearer <token>' "
                                    "(strata: STRATA_GRPC_TOKEN)")
        if self.tokens.client_of(token) is None:
            log.warning("refused %s: unknown bearer token", handler_call_details.method)
            return _denial(handler, "unknown bearer token")
        return handler


class CallerIdentity:
    """Who is calling, for per-client limits: the token's client when tokens are on, else the address."""

    def __init__(self, tokens: TokenTable | None = None) -> None:
        self.tokens = tokens

    def of(self, context: grpc.ServicerContext) -> str:
        if self.tokens is not None:
            token = bearer_of(context.invocation_metadata())
            name = self.tokens.client_of(token) if token is not None else None
            if name is not None:
                return f"client:{name}"
        return address_of(context.peer())


def address_of(peer: str) -> str:
    """The peer's address without its port (``ipv4:10.0.0.5:53122`` -> ``ipv4:10.0.0.5``)."""
    return peer.rsplit(":", 1)[0] if peer.count(":") >= 2 else peer


# -- client side ----------------------------------------------------------------------------------------

class _BearerMetadata(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                      grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds the bearer token to every call on a channel without TLS (call credentials need TLS)."""

    def __init__(self, token: str) -> None:
        self._header = (AUTHORIZATION, f"Bearer {token}")

    def _details(self, details: Any) -> Any:
        metadata = [*(details.metadata or ()), self._header]
        return _CallDetails(details.method, details.timeout, metadata, details.credentials,
                            getattr(details, "wait_for_ready", None), getattr(details, "compression", None))

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)


@dataclass(frozen=True)
class _CallDetails(grpc.ClientCallDetails):
    method: str
    timeout: float | None
    metadata: Any
    credentials: Any
    wait_for_ready: bool | None
    compression: Any


def with_bearer(channel: grpc.Channel, token: str) -> grpc.Channel:
    return grpc.intercept_channel(channel, _BearerMetadata(token))


def token_line(name: str, token: str, hashed: bool = True) -> str:
    """The tokens-file line for ``name``: the digest by default, so the server holds no secret."""
    return f"{name} {DIGEST_PREFIX}{digest_of(token).hex()}" if hashed else f"{name} {token}"
