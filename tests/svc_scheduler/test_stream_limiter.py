from svc_scheduler.watch import StreamLimiter, client_of


def test_streams_are_capped_globally_and_per_client() -> None:
    limiter = StreamLimiter(limit=3, per_client=2)
    assert limiter.acquire("a") is None and limiter.acquire("a") is None
    assert "limit 2 per client" in (limiter.acquire("a") or "")
    assert limiter.acquire("b") is None
    assert "limit 3" in (limiter.acquire("c") or "")
    limiter.release("a")
    assert limiter.open == 2 and limiter.acquire("c") is None
    for client in ("a", "b", "c"):
        limiter.release(client)
    assert limiter.open == 0


def test_a_client_is_its_address_without_the_port() -> None:
    assert client_of("ipv4:10.0.0.5:53122") == "ipv4:10.0.0.5"
    assert client_of("ipv6:[::1]:40000") == "ipv6:[::1]"
    assert client_of("unix:/tmp/sock") == "unix:/tmp/sock"
