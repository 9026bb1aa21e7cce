"""Redis clients from one URL: a plain Redis, or the primary that Redis Sentinel names.

``redis://`` and ``rediss://`` URLs go to redis-py's ``Redis.from_url`` as they are. A
``redis+sentinel://[user:password@]host:port[,host:port...]/<primary name>[/<db>]`` URL asks those
Sentinels for the current primary of ``<primary name>`` and follows it: after a failover the next
connection goes to the promoted replica (redis-py's ``SentinelConnectionPool``). The user and
password are those of the data nodes; the Sentinels themselves are asked without a login.

Every Redis client in Strata is made here, so one setting (``STRATA_REDIS_URL``, or the
``redis_sentinels`` settings) moves every service onto a Sentinel-managed Redis.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import redis
from redis.sentinel import Sentinel

SENTINEL_SCHEME = "redis+sentinel"


@dataclass(frozen=True)
class SentinelAddress:
    sentinels: tuple[tuple[str, int], ...]
    primary: str
    db: int
    username: str | None
    password: str | None


def parse_sentinel_url(url: str) -> SentinelAddress:
    """The parts of a ``redis+sentinel://`` URL; ValueError naming what is wrong."""
    parts = urlsplit(url)
    if parts.scheme != SENTINEL_SCHEME:
        raise ValueError(f"not a {SENTINEL_SCHEME}:// URL")
    hosts = parts.netloc.rpartition("@")[2]
    sentinels = []
    for entry in hosts.split(","):
        host, _, port = entry.strip().rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"{SENTINEL_SCHEME} URL: sentinel {entry!r} is not host:port")
        sentinels.append((host.strip("[]"), int(port)))
    path = [segment for segment in parts.path.split("/") if segment]
    if not path or len(path) > 2:
        raise ValueError(f"{SENTINEL_SCHEME} URL: the path must be /<primary name>[/<db>], got {parts.path!r}")
    if len(path) == 2 and not path[1].isdigit():
        raise ValueError(f"{SENTINEL_SCHEME} URL: db {path[1]!r} is not a number")
    userinfo = parts.netloc.rpartition("@")[0] if "@" in parts.netloc else ""
    username, _, password = userinfo.partition(":")
    return SentinelAddress(
        sentinels=tuple(sentinels), primary=unquote(path[0]), db=int(path[1]) if len(path) == 2 else 0,
        username=unquote(username) or None, password=unquote(password) if password else None,
    )


def connect(url: str, **kwargs: Any) -> redis.Redis:
    """A client for ``url``; ``kwargs`` (timeouts, retry, ...) go to every connection it makes."""
    if not url.startswith(SENTINEL_SCHEME + "://"):
        return redis.Redis.from_url(url, **kwargs)
    address = parse_sentinel_url(url)
    timeout = kwargs.get("socket_connect_timeout") or kwargs.get("socket_timeout") or 5
    sentinel = Sentinel(list(address.sentinels), socket_timeout=timeout,
                        sentinel_kwargs={"socket_timeout": timeout, "socket_connect_timeout": timeout})
    return sentinel.master_for(address.primary, db=address.db, username=address.username,
                               password=address.password, **kwargs)


def sentinel_url(sentinels: str, primary: str, username: str | None = None, password: str | None = None,
                 db: int = 0) -> str:
    """The ``redis+sentinel://`` URL of ``sentinels`` ("host:port,host:port") and ``primary``."""
    credentials = ""
    if password is not None:
        credentials = f"{quote(username or '', safe='')}:{quote(password, safe='')}@"
    return f"{SENTINEL_SCHEME}://{credentials}{sentinels}/{quote(primary, safe='')}/{db}"
