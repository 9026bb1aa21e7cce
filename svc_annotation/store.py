"""The annotation desk in Redis: the durable queue of items, their assignments and scores.

Every change of the queue is one Lua script, so it is atomic under any number of annotators and
replicas: two annotators never both fill the one slot of an item, an annotator never scores an item
twice, a redelivered request never queues an item twice. The rules are ``svc_annotation.core``'s;
time comes from an injected clock (epoch seconds), so tests move it instead of sleeping.

Keys, under ``<p>`` = ``redis_prefix`` (default ``strata:annotation``):

    <p>:item:<id>     hash    the item: core.Item's fields; ``event`` holds the AnnotationRequested bytes
    <p>:scores:<id>   hash    annotator -> {"score", "unsafe", "off_topic", "at"} (JSON)
    <p>:assign:<id>   hash    annotator -> assigned until (epoch seconds)
    <p>:sent:<id>     hash    what Kafka acknowledged: "final", "c:<annotator>" (its AnnotationCompleted)
    <p>:pending       zset    open items by enqueue time: the queue, oldest first
    <p>:deadlines     zset    open items by deadline
    <p>:open          hash    annotator -> the item of its open assignment (one at a time)
    <p>:gold          zset    gold item ids in the gold file's order
    <p>:outbox        zset    items with something to publish, by change number (<p>:seq)
    <p>:stats         hash    enqueued, completed, expired, gold_scores; a:<annotator>:scored|gold|served|sum
    <p>:publisher     string  the replica whose turn it is to close and publish (a lease)

An item's keys expire ``item_retention_s`` after its last change (the settings make that longer than
the deadline, so an open item never expires); gold items stay. The scripts compute per-item keys
from the prefix, so they need one Redis (not a cluster), as the rest of Strata does.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import redis
from prometheus_client import Counter

from strata.content_store import ContentStore
from svc_annotation.core import (
    COMPLETE,
    EXPIRED,
    GOLD,
    PENDING,
    RETIRED,
    AlreadyScoredError,
    AnnotatorStats,
    DeskStatus,
    GoldItem,
    Item,
    NotAssignedError,
    Offer,
    Rules,
    Score,
    UnknownItemError,
    check_annotator,
    check_item_id,
    check_score,
    gold_due,
    gold_item_id,
)

SCORES = Counter("strata_annotation_scores", "Scores recorded, per annotator (gold items included)", ["annotator"])

# Queue an item unless it is known. KEYS: item, pending, deadlines, stats.
# ARGV: id, enqueued_at, deadline_at, retention_s, then the item's field/value pairs.
_ENQUEUE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local fields = {}
for i = 5, #ARGV do fields[#fields + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('EXPIRE', KEYS[1], ARGV[4])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[1])
redis.call('HINCRBY', KEYS[4], 'enqueued', 1)
return 1
"""

# Shared by the scripts that read slots: holders of an unexpired assignment other than `who`. An
# expired one holds nothing (its item is back in the queue) but stays, so that its annotator's late
# score is told what happened; it goes when the item closes or its holder asks for another.
_HELD_BY_OTHERS = """
local function held_by_others(p, id, who, now)
  local held = redis.call('HGETALL', p .. ':assign:' .. id)
  local n = 0
  for i = 1, #held, 2 do
    if held[i] ~= who and tonumber(held[i + 1]) > now then n = n + 1 end
  end
  return n
end
"""

# The annotator's open assignment if it holds (or is stale but its slot still free), else a gold
# item when one is due, else the oldest open item it has not scored with a free slot.
# ARGV: prefix, annotator, now, until, want_gold (0/1), retention_s. Returns {id, until, new} or false.
_NEXT = _HELD_BY_OTHERS + """
local p, who, now, until_, want_gold, keep = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5] == '1', ARGV[6]
local function assign(id, gold)
  redis.call('HSET', p .. ':assign:' .. id, who, until_)
  if not gold then redis.call('EXPIRE', p .. ':assign:' .. id, keep) end
  redis.call('HSET', p .. ':open', who, id)
end
local function served()
  redis.call('HINCRBY', p .. ':stats', 'a:' .. who .. ':served', 1)
end

local open = redis.call('HGET', p .. ':open', who)
if open then
  local f = redis.call('HMGET', p .. ':item:' .. open, 'state', 'needs', 'deadline_at')
  local mine = redis.call('HGET', p .. ':assign:' .. open, who)
  local unscored = redis.call('HEXISTS', p .. ':scores:' .. open, who) == 0
  local live = f[1] == 'gold' or (f[1] == 'pending' and tonumber(f[3]) > now)
  if mine and unscored and live then
    if tonumber(mine) > now then return {open, mine, '0'} end
    if f[1] == 'gold' or redis.call('HLEN', p .. ':scores:' .. open) + held_by_others(p, open, who, now)
        < tonumber(f[2]) then
      assign(open, f[1] == 'gold')
      return {open, until_, '0'}
    end
  end
  redis.call('HDEL', p .. ':open', who)
  if mine then redis.call('HDEL', p .. ':assign:' .. open, who) end
end

if want_gold then
  for _, g in ipairs(redis.call('ZRANGE', p .. ':gold', 0, -1)) do
    if redis.call('HEXISTS', p .. ':scores:' .. g, who) == 0 then
      assign(g, true)
      served()
      return {g, until_, '1'}
    end
  end
end

local start = 0
while true do
  local ids = redis.call('ZRANGE', p .. ':pending', start, start + 99)
  if #ids == 0 then break end
  for _, id in ipairs(ids) do
    if redis.call('HEXISTS', p .. ':scores:' .. id, who) == 0 then
      local f = redis.call('HMGET', p .. ':item:' .. id, 'state', 'needs', 'deadline_at')
      if f[1] == 'pending' and tonumber(f[3]) > now
          and redis.call('HLEN', p .. ':scores:' .. id) + held_by_others(p, id, who, now) < tonumber(f[2]) then
        assign(id, false)
        served()
        return {id, until_, '1'}
      end
    end
  end
  start = start + 100
end
return false
"""

# Record a score. ARGV: prefix, annotator, id, now, score JSON, score, retention_s.
# Returns {'ok', 'open'|'complete'|'gold', <annotator's scores>} or {<refusal>, <detail>}.
_SCORE = _HELD_BY_OTHERS + """
local p, who, id, now, entry, score, keep = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5], ARGV[6], ARGV[7]
local item, scores, assign = p .. ':item:' .. id, p .. ':scores:' .. id, p .. ':assign:' .. id
local stats = p .. ':stats'
local f = redis.call('HMGET', item, 'state', 'needs')
if not f[1] then return {'not_found', ''} end
if redis.call('HEXISTS', scores, who) == 1 then return {'already', ''} end
local state = f[1]
if state ~= 'pending' and state ~= 'gold' then return {'closed', state} end
local mine = redis.call('HGET', assign, who)
if not mine then return {'not_assigned', ''} end
if state == 'pending' and tonumber(mine) <= now
    and redis.call('HLEN', scores) + held_by_others(p, id, who, now) >= tonumber(f[2]) then
  redis.call('HDEL', assign, who)
  return {'taken', ''}
end
redis.call('HSET', scores, who, entry)
redis.call('HDEL', assign, who)
if redis.call('HGET', p .. ':open', who) == id then redis.call('HDEL', p .. ':open', who) end
if state == 'gold' then
  redis.call('HINCRBY', stats, 'gold_scores', 1)
  local mine_total = redis.call('HINCRBY', stats, 'a:' .. who .. ':gold', 1)
  redis.call('ZADD', p .. ':outbox', redis.call('INCR', p .. ':seq'), id)
  return {'ok', 'gold', tostring(mine_total + tonumber(redis.call('HGET', stats, 'a:' .. who .. ':scored') or '0'))}
end
redis.call('EXPIRE', scores, keep)
local mine_total = redis.call('HINCRBY', stats, 'a:' .. who .. ':scored', 1)
redis.call('HINCRBYFLOAT', stats, 'a:' .. who .. ':sum', score)
mine_total = mine_total + tonumber(redis.call('HGET', stats, 'a:' .. who .. ':gold') or '0')
if redis.call('HLEN', scores) >= tonumber(f[2]) then
  redis.call('HSET', item, 'state', 'complete', 'closed_at', ARGV[4])
  redis.call('EXPIRE', item, keep)
  redis.call('ZREM', p .. ':pending', id)
  redis.call('ZREM', p .. ':deadlines', id)
  redis.call('DEL', assign)
  redis.call('HINCRBY', stats, 'completed', 1)
  redis.call('ZADD', p .. ':outbox', redis.call('INCR', p .. ':seq'), id)
  return {'ok', 'complete', tostring(mine_total)}
end
return {'ok', 'open', tostring(mine_total)}
"""

# Close items past their deadline: 'complete' with the scores they have, else 'expired'.
# ARGV: prefix, now, limit, retention_s. Returns {id, state, id, state, ...}.
_CLOSE_DUE = """
local p, now, limit, keep = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local closed = {}
for _, id in ipairs(redis.call('ZRANGEBYSCORE', p .. ':deadlines', '-inf', now, 'LIMIT', 0, limit)) do
  redis.call('ZREM', p .. ':deadlines', id)
  local item = p .. ':item:' .. id
  local state = redis.call('HGET', item, 'state')
  if not state then redis.call('ZREM', p .. ':pending', id) end  -- forgotten (retention passed): out of the queue
  if state == 'pending' then
    state = 'expired'
    if redis.call('HLEN', p .. ':scores:' .. id) > 0 then state = 'complete' end
    redis.call('HSET', item, 'state', state, 'closed_at', now)
    redis.call('EXPIRE', item, keep)
    redis.call('ZREM', p .. ':pending', id)
    redis.call('DEL', p .. ':assign:' .. id)
    redis.call('HINCRBY', p .. ':stats', state == 'expired' and 'expired' or 'completed', 1)
    redis.call('ZADD', p .. ':outbox', redis.call('INCR', p .. ':seq'), id)
    closed[#closed + 1] = id
    closed[#closed + 1] = state
  end
end
return closed
"""

# Leave the outbox unless something changed since it was read. KEYS: outbox. ARGV: id, seq.
_SETTLE = """
local seq = redis.call('ZSCORE', KEYS[1], ARGV[1])
if seq and tonumber(seq) == tonumber(ARGV[2]) then redis.call('ZREM', KEYS[1], ARGV[1]) return 1 end
return 0
"""

# Take or renew the publisher lease. KEYS: lease. ARGV: owner, lease_ms.
_HOLD = """
local owner = redis.call('GET', KEYS[1])
if owner == false or owner == ARGV[1] then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end
return 0
"""


@dataclass(frozen=True)
class Ready:
    """An item in the outbox: what the loop publishes for it."""

    item: Item
    scores: tuple[Score, ...]   # in the order they came in
    sent: frozenset[str]        # already acknowledged: "final", "c:<annotator>"
    seq: float                  # the change it was read at (settle only if unchanged)


def _text(value: bytes | str | None) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else (value or "")


def _item_from_hash(item_id: str, raw: dict[bytes, bytes]) -> Item:
    f = {k.decode(): v for k, v in raw.items()}
    gold_score = _text(f.get("gold_score"))
    return Item(
        item_id=item_id, prompt_hash=_text(f.get("prompt_hash")), response_hash=_text(f.get("response_hash")),
        request_id=_text(f.get("request_id")), sample_index=int(_text(f.get("sample_index")) or 0),
        needs=int(_text(f.get("needs")) or 0), enqueued_at=float(_text(f.get("enqueued_at")) or 0),
        deadline_at=float(_text(f.get("deadline_at")) or 0), awaits_final=_text(f.get("awaits_final")) == "1",
        state=_text(f.get("state")), gold_score=float(gold_score) if gold_score else None,
        event=f.get("event") or b"",
    )


def _scores_from_hash(raw: dict[bytes, bytes]) -> tuple[Score, ...]:
    scores = []
    for who, entry in raw.items():
        data = json.loads(entry)
        scores.append(Score(who.decode(), float(data["score"]), bool(data["unsafe"]), bool(data["off_topic"]),
                            float(data["at"])))
    return tuple(sorted(scores, key=lambda s: (s.scored_at, s.annotator)))


class AnnotationStore:
    """The desk's queue. Thread-safe (redis-py's client is); every method is one or a few round trips."""

    def __init__(self, client: redis.Redis, content: ContentStore, prefix: str, rules: Rules, retention_s: int,
                 clock: Callable[[], float] = time.time) -> None:
        self._redis = client
        self._content = content
        self._p = prefix
        self.rules = rules
        self._retention_s = retention_s
        self.clock = clock
        self._enqueue = client.register_script(_ENQUEUE)
        self._next = client.register_script(_NEXT)
        self._score = client.register_script(_SCORE)
        self._close_due = client.register_script(_CLOSE_DUE)
        self._settle = client.register_script(_SETTLE)
        self._hold = client.register_script(_HOLD)

    def _key(self, *parts: str) -> str:
        return ":".join((self._p, *parts))

    # -- the queue ---------------------------------------------------------------------------------

    def enqueue(self, item: Item) -> bool:
        """Queue ``item``; False when it is already known (a redelivered or duplicated request)."""
        fields = {
            "prompt_hash": item.prompt_hash, "response_hash": item.response_hash, "request_id": item.request_id,
            "sample_index": str(item.sample_index), "needs": str(item.needs), "enqueued_at": repr(item.enqueued_at),
            "deadline_at": repr(item.deadline_at), "awaits_final": "1" if item.awaits_final else "0",
            "state": PENDING, "gold_score": "", "event": item.event,
        }
        pairs = [x for kv in fields.items() for x in kv]
        added = self._enqueue(
            keys=[self._key("item", item.item_id), self._key("pending"), self._key("deadlines"), self._key("stats")],
            args=[item.item_id, repr(item.enqueued_at), repr(item.deadline_at), self._retention_s, *pairs],
        )
        return bool(added)

    def item(self, item_id: str) -> Item | None:
        raw = self._redis.hgetall(self._key("item", item_id))
        return _item_from_hash(item_id, raw) if raw else None

    def next_item(self, annotator: str) -> Offer | None:
        """The annotator's next item with its texts, assigned to it for ``assignment_ttl_s``; None
        when there is nothing it may score now."""
        check_annotator(annotator)
        now = self.clock()
        served = int(self._redis.hget(self._key("stats"), f"a:{annotator}:served") or 0)
        want_gold = gold_due(annotator, served, self.rules.gold_share)
        until = now + self.rules.assignment_ttl_s
        found = self._next(args=[self._p, annotator, repr(now), repr(until), "1" if want_gold else "0",
                                 self._retention_s])
        if not found:
            return None
        item_id, assigned_until, new = (_text(v) for v in found)
        hashes = self._redis.hmget(self._key("item", item_id), "prompt_hash", "response_hash")
        prompt = self._content.get_text(_text(hashes[0]))
        response = self._content.get_text(_text(hashes[1]))
        return Offer(item_id, prompt, response, float(assigned_until), new == "1")

    def submit_score(self, annotator: str, item_id: str, score: float, unsafe: bool = False,
                     off_topic: bool = False) -> int:
        """Record ``annotator``'s score of ``item_id``; returns its number of scores so far.

        Raises InvalidRequestError (bad score, annotator or item id), UnknownItemError,
        AlreadyScoredError, or NotAssignedError (not assigned to it, its stale assignment went to
        someone else, or the item is closed). A refused score changes nothing.
        """
        check_annotator(annotator)
        check_item_id(item_id)
        value = check_score(score)
        now = self.clock()
        entry = json.dumps({"score": value, "unsafe": bool(unsafe), "off_topic": bool(off_topic), "at": now})
        outcome, detail, *rest = (_text(v) for v in self._score(
            args=[self._p, annotator, item_id, repr(now), entry, repr(value), self._retention_s]))
        if outcome == "ok":
            SCORES.labels(annotator=annotator).inc()
            return int(rest[0])
        if outcome == "not_found":
            raise UnknownItemError(f"item_id: no item {item_id} (never queued, or closed and forgotten)")
        if outcome == "already":
            raise AlreadyScoredError(f"{annotator} already scored item {item_id}; the first score stands")
        if outcome == "closed":
            why = {EXPIRED: "its deadline passed with no score", COMPLETE: "its scores are in",
                   RETIRED: "it left the gold set"}.get(detail, detail)
            raise NotAssignedError(f"item {item_id} is closed ({why}); ask Next for another")
        if outcome == "taken":
            raise NotAssignedError(f"your assignment of item {item_id} went stale and the item went to another "
                                   "annotator; ask Next for another")
        raise NotAssignedError(f"item {item_id} is not assigned to {annotator}; ask Next for an item first")

    # -- gold items --------------------------------------------------------------------------------

    def load_gold(self, items: Sequence[GoldItem]) -> list[str]:
        """Make ``items`` the gold set (texts into the content store); gold items no longer in it
        are retired. Idempotent; returns the gold item ids in order."""
        ids: list[str] = []
        fields: list[tuple[str, dict[str, str]]] = []
        for gold in items:
            prompt_hash, response_hash = self._content.put(gold.prompt), self._content.put(gold.response)
            gold_id = gold_item_id(prompt_hash, response_hash)
            if gold_id in ids:
                continue
            ids.append(gold_id)
            fields.append((gold_id, {
                "prompt_hash": prompt_hash, "response_hash": response_hash, "request_id": "", "sample_index": "0",
                "needs": "0", "enqueued_at": "0", "deadline_at": "0", "awaits_final": "0", "state": GOLD,
                "gold_score": repr(gold.score),
            }))
        retired = {_text(g) for g in self._redis.zrange(self._key("gold"), 0, -1)} - set(ids)
        with self._redis.pipeline(transaction=True) as pipe:
            for gold_id, mapping in fields:
                pipe.hset(self._key("item", gold_id), mapping=mapping)
            for gold_id in retired:
                pipe.zrem(self._key("gold"), gold_id)
                pipe.hset(self._key("item", gold_id), "state", RETIRED)
            if ids:
                pipe.zadd(self._key("gold"), {gold_id: i for i, gold_id in enumerate(ids)})
            pipe.execute()
        return ids

    # -- the loop: close due items, publish, settle ------------------------------------------------

    def close_due(self, limit: int) -> list[tuple[str, str]]:
        """Close up to ``limit`` items past their deadline: (item id, COMPLETE or EXPIRED)."""
        flat = [_text(v) for v in self._close_due(args=[self._p, repr(self.clock()), limit, self._retention_s])]
        return list(zip(flat[::2], flat[1::2], strict=True))

    def outbox(self, limit: int) -> list[Ready]:
        """Up to ``limit`` items with something to publish, oldest change first."""
        entries = self._redis.zrange(self._key("outbox"), 0, limit - 1, withscores=True)
        if not entries:
            return []
        with self._redis.pipeline(transaction=False) as pipe:
            for member, _ in entries:
                item_id = _text(member)
                pipe.hgetall(self._key("item", item_id))
                pipe.hgetall(self._key("scores", item_id))
                pipe.hkeys(self._key("sent", item_id))
            replies = pipe.execute()
        ready = []
        for i, (member, seq) in enumerate(entries):
            raw_item, raw_scores, sent = replies[3 * i: 3 * i + 3]
            if not raw_item:  # forgotten (retention passed): nothing left to publish
                self.settle(_text(member), seq)
                continue
            ready.append(Ready(_item_from_hash(_text(member), raw_item), _scores_from_hash(raw_scores),
                               frozenset(_text(s) for s in sent), seq))
        return ready

    def mark_sent(self, item: Item, what: str) -> bool:
        """Record that Kafka acknowledged ``what`` ("final", "c:<annotator>") of ``item``; False when
        it already was (then it was published twice, which consumers must tolerate)."""
        key = self._key("sent", item.item_id)
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.hsetnx(key, what, "1")
            if not item.gold:
                pipe.expire(key, self._retention_s)
            first, *_ = pipe.execute()
        return bool(first)

    def settle(self, item_id: str, seq: float) -> bool:
        """Take ``item_id`` out of the outbox unless it changed since it was read at ``seq``."""
        return bool(self._settle(keys=[self._key("outbox")], args=[item_id, repr(seq)]))

    def hold_publisher(self, owner: str, lease_s: float) -> bool:
        """Take or renew the lease of the one replica that closes and publishes."""
        return bool(self._hold(keys=[self._key("publisher")], args=[owner, max(1, int(lease_s * 1000))]))

    # -- numbers -----------------------------------------------------------------------------------

    def queue_depth(self) -> int:
        return int(self._redis.zcard(self._key("pending")))

    def status(self) -> DeskStatus:
        now = self.clock()
        with self._redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(self._key("stats"))
            pipe.hgetall(self._key("open"))
            pipe.zcard(self._key("pending"))
            pipe.zcard(self._key("gold"))
            raw_stats, raw_open, depth, gold = pipe.execute()
        stats = {_text(k): _text(v) for k, v in raw_stats.items()}
        opens = {_text(k): _text(v) for k, v in raw_open.items()}
        with self._redis.pipeline(transaction=False) as pipe:
            for who, item_id in opens.items():
                pipe.hget(self._key("assign", item_id), who)
            holding = {who for who, until in zip(opens, pipe.execute(), strict=True)
                       if until is not None and float(until) > now}
        per: dict[str, dict[str, float]] = {}
        for key, value in stats.items():
            if key.startswith("a:"):
                who, _, field = key[2:].rpartition(":")
                per.setdefault(who, {})[field] = float(value)
        for who in holding:
            per.setdefault(who, {})
        annotators = {}
        for who, counts in sorted(per.items()):
            scored = int(counts.get("scored", 0))
            mean = counts.get("sum", 0.0) / scored if scored else 0.0
            annotators[who] = AnnotatorStats(scored, int(counts.get("gold", 0)), int(counts.get("served", 0)),
                                             mean if math.isfinite(mean) else 0.0, who in holding)
        return DeskStatus(queue_depth=int(depth), assigned=len(holding), enqueued=int(stats.get("enqueued", 0)),
                          completed=int(stats.get("completed", 0)), expired=int(stats.get("expired", 0)),
                          gold_items=int(gold), annotators=annotators)
