"""Per-client limits at the edge: open streams and the Submit rate (strata.ratelimit)."""

from strata.ratelimit import RateLimiter, RetryHints, StreamLimiter
from strata.rpc_auth import address_of


def test_stream_limiter_caps_globally_and_per_client() -> None:
    limiter = StreamLimiter(limit=3, per_client=2, what="Watch streams")
    assert limiter.acquire("a") is None
    assert limiter.acquire("a") is None
    assert "per client" in (limiter.acquire("a") or "")
    assert limiter.acquire("b") is None
    assert "limit 3" in (limiter.acquire("c") or "")
    limiter.release("a")
    assert limiter.acquire("c") is None
    assert limiter.open == 3
    limiter.release("zzz")  # a client that holds nothing: no effect, no negative count
    assert limiter.open == 3


def test_client_address_drops_the_port() -> None:
    assert address_of("ipv4:10.0.0.5:53122") == "ipv4:10.0.0.5"
    assert address_of("ipv6:[::1]:40000") == "ipv6:[::1]"
    assert address_of("unix:/tmp/sock") == "unix:/tmp/sock"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_rate_limiter_refills_at_its_rate_and_says_when_to_retry() -> None:
    clock = Clock()
    limiter = RateLimiter(rate=10, burst=5, clock=clock)
    assert all(limiter.take("a") is None for _ in range(5))
    wait = limiter.take("a")
    assert wait is not None and abs(wait - 0.1) < 1e-9
    assert limiter.take("b") is None  # one client's flood leaves another's bucket alone
    clock.now = 0.1
    assert limiter.take("a") is None
    assert limiter.take("a") is not None


def test_a_batch_larger_than_the_burst_passes_once_and_is_paid_for_after() -> None:
    clock = Clock()
    limiter = RateLimiter(rate=10, burst=5, clock=clock)
    assert limiter.take("a", 20) is None  # needs a full bucket, then owes 15
    wait = limiter.take("a")
    assert wait is not None and abs(wait - 1.6) < 1e-9


def test_rate_zero_is_no_limit_and_the_client_table_is_bounded() -> None:
    assert RateLimiter(rate=0, burst=1).take("a", 10**6) is None
    limiter = RateLimiter(rate=1, burst=1, max_clients=2, clock=Clock())
    for name in ("a", "b", "c"):
        assert limiter.take(name) is None
    assert limiter.take("a") is None  # "a" was forgotten (least recently seen): a fresh bucket
    assert limiter.take("c") is not None


def test_a_refund_gives_back_what_was_charged_up_to_the_burst() -> None:
    clock = Clock()
    limiter = RateLimiter(rate=1, burst=3, clock=clock)
    assert limiter.take("a", 3) is None
    assert limiter.take("a") is not None  # spent
    limiter.refund("a", 2)  # two of the three were shed at the door: the retry may come at once
    assert limiter.take("a", 2) is None
    limiter.refund("a", 10)
    assert limiter.take("a", 3) is None and limiter.take("a") is not None  # never more than the burst
    limiter.refund("unknown", 5)  # a client never charged: nothing to give back, nothing kept
    assert "unknown" not in limiter._buckets


def test_a_hint_is_honoured_once_it_has_passed() -> None:
    clock = Clock()
    hints = RetryHints(max_clients=2, clock=clock)
    assert hints.honoured("a")  # never told to wait
    hints.told("a", 5.0)
    clock.now = 4.9
    assert not hints.honoured("a")  # came back early
    clock.now = 5.0
    assert hints.honoured("a")
    hints.told("b", 1.0)
    hints.told("c", 1.0)  # past max_clients: "a", told longest ago, is forgotten
    clock.now = 5.1
    hints.told("b", 100.0)
    assert hints.honoured("a") and not hints.honoured("b")
