"""The annotators' web page (svc_annotation/web.py) with Flask's test client over a real store on
the session's Redis: login, the annotate flow, refusals and the lead's page. The browser test
(test_browser.py) drives the same pages in Chromium inside the running service."""

from __future__ import annotations

import html
import re
import ssl
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from flask.testing import FlaskClient
from test_service import TTL_S, Clock, sample

from strata.config import StrataSettings
from strata.content_store import ContentStore
from strata.rpc_auth import TokenTable, token_line
from svc_annotation.core import Rules
from svc_annotation.store import AnnotationStore
from svc_annotation.web import WebServer, create_app
from svc_annotation.worker import item_of

pytestmark = pytest.mark.integration

ANN_TOKEN, LEAD_TOKEN = "ann-token-0123456789", "lea-token-0123456789"


@pytest.fixture
def content(redis_client: redis.Redis, infra: StrataSettings) -> ContentStore:
    return ContentStore(redis_client, infra.content_ttl_s, infra.content_max_bytes)


@pytest.fixture
def store(redis_client: redis.Redis, content: ContentStore) -> AnnotationStore:
    return AnnotationStore(redis_client, content, f"test:web:{uuid.uuid4().hex[:8]}", Rules(0.0, 0.0, TTL_S, 3600.0),
                           7 * 24 * 3600, Clock())


@pytest.fixture
def tokens(tmp_path: Path) -> TokenTable:
    path = tmp_path / "tokens"
    path.write_text(f"{token_line('ann', ANN_TOKEN)}\n{token_line('lea', LEAD_TOKEN)}\n")
    return TokenTable.load(path)


@pytest.fixture
def client(store: AnnotationStore, tokens: TokenTable) -> FlaskClient:
    return create_app(store, tokens, frozenset({"lea"})).test_client()


def queue(store: AnnotationStore, content: ContentStore) -> str:
    item = item_of(sample(content, double=False), store.clock(), store.rules)
    assert store.enqueue(item)
    store.clock.advance(1)  # type: ignore[attr-defined]  # the queue's order is the enqueue time's
    return item.item_id


def log_in(client: FlaskClient, token: str = ANN_TOKEN) -> None:
    reply = client.post("/login", data={"token": token})
    assert reply.status_code == 303 and reply.headers["Location"].endswith("/annotate")


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, "no CSRF token on the page"
    return found.group(1)


def shown_item(page: str) -> str | None:
    found = re.search(r'data-item-id="([^"]+)"', page)
    return found.group(1) if found else None


def test_login_needs_a_known_token(client: FlaskClient) -> None:
    assert client.get("/annotate").headers["Location"].endswith("/login")  # no session: the login page
    assert client.get("/login").status_code == 200
    missing = client.post("/login", data={})
    assert missing.status_code == 401 and "Enter your token." in missing.text
    wrong = client.post("/login", data={"token": "wrong-token-0123456789"})
    assert wrong.status_code == 401 and "Unknown token" in wrong.text
    assert client.get("/annotate").status_code == 303  # still nobody
    log_in(client)
    page = client.get("/annotate")
    assert page.status_code == 200 and '<span class="who">ann</span>' in page.text
    cookie = client.get_cookie("strata_annotation")
    assert cookie is not None and cookie.http_only and cookie.same_site == "Strict"
    assert ANN_TOKEN not in cookie.value  # the token's digest only
    out = client.post("/logout", data={"csrf": csrf_of(page.text)})
    assert out.status_code == 303 and client.get("/annotate").status_code == 303


def test_without_a_tokens_file_nobody_logs_in(store: AnnotationStore) -> None:
    client = create_app(store, None, frozenset({"ann"})).test_client()
    for reply in (client.get("/login"), client.post("/login", data={"token": ANN_TOKEN})):
        assert reply.status_code == 503 and "tokens must be configured" in reply.text
    assert client.get("/annotate").status_code == 303 and client.get("/lead").status_code == 303


def test_a_session_ends_when_its_token_leaves_the_tokens_file(store: AnnotationStore, tokens: TokenTable,
                                                             tmp_path: Path) -> None:
    key = "k" * 32
    before = create_app(store, tokens, secret_key=key).test_client()
    log_in(before)
    cookie = before.get_cookie("strata_annotation")
    assert cookie is not None
    path = tmp_path / "tokens-after"
    path.write_text(f"{token_line('lea', LEAD_TOKEN)}\n")  # ann's token revoked, the service restarted
    after = create_app(store, TokenTable.load(path), secret_key=key).test_client()
    after.set_cookie("strata_annotation", cookie.value)
    assert after.get("/annotate").status_code == 303


def test_score_items_one_after_another_until_none_is_left(client: FlaskClient, store: AnnotationStore,
                                                          content: ContentStore) -> None:
    first, second = queue(store, content), queue(store, content)
    log_in(client)
    page = client.get("/annotate")
    assert shown_item(page.text) == first
    assert content.get_text(store.item(first).response_hash) in page.text  # type: ignore[union-attr]
    assert page.headers["Cache-Control"] == "no-store"
    assert "script-src 'self'; style-src 'self'" in page.headers["Content-Security-Policy"]
    assert shown_item(client.get("/annotate").text) == first  # asked again: the same open assignment
    done = client.post("/score", data={"csrf": csrf_of(page.text), "item_id": first, "score": "3.5",
                                       "unsafe": "on"}, follow_redirects=True)
    assert done.status_code == 200 and "Scored 3.5. 1 scored so far." in done.text
    assert shown_item(done.text) == second
    done = client.post("/score", data={"csrf": csrf_of(done.text), "item_id": second, "score": "0",
                                       "off_topic": "on"}, follow_redirects=True)
    assert shown_item(done.text) is None and "Nothing to annotate right now" in done.text
    status = store.status()
    assert (status.completed, status.queue_depth, status.annotators["ann"].scored) == (2, 0, 2)
    scores = {ready.item.item_id: ready.scores[0] for ready in store.outbox(10)}
    assert (scores[first].score, scores[first].unsafe, scores[first].off_topic) == (3.5, True, False)
    assert (scores[second].score, scores[second].unsafe, scores[second].off_topic) == (0.0, False, True)


def test_texts_are_escaped(client: FlaskClient, store: AnnotationStore, content: ContentStore) -> None:
    event = sample(content, double=False)
    event.response_hash = event.provisional.response_hash = content.put("<script>alert(1)</script> & more")
    assert store.enqueue(item_of(event, store.clock(), store.rules))
    log_in(client)
    page = client.get("/annotate").text
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; more" in page and "<script>alert" not in page


@pytest.mark.parametrize(("score", "words"), [("7", "score: must be in [0, 5], got 7"),
                                              ("-0.5", "score: must be in [0, 5]"),
                                              ("nan", "score: must be a finite number"),
                                              ("abc", "score: must be a number from 0 to 5, got 'abc'"),
                                              ("", "score: missing")])
def test_a_bad_score_is_400_and_records_nothing(client: FlaskClient, store: AnnotationStore, content: ContentStore,
                                                score: str, words: str) -> None:
    item = queue(store, content)
    log_in(client)
    page = client.get("/annotate").text
    reply = client.post("/score", data={"csrf": csrf_of(page), "item_id": item, "score": score})
    assert reply.status_code == 400 and words in html.unescape(reply.text)
    assert shown_item(reply.text) == item  # the same item again, to score properly
    assert store.status().annotators["ann"].scored == 0 and store.queue_depth() == 1


def test_unknown_and_malformed_items_and_a_stale_form_are_refused(client: FlaskClient, store: AnnotationStore,
                                                                  content: ContentStore) -> None:
    item = queue(store, content)
    log_in(client)
    csrf = csrf_of(client.get("/annotate").text)
    unknown = client.post("/score", data={"csrf": csrf, "item_id": "0" * 32, "score": "3"})
    assert unknown.status_code == 404 and "no item" in unknown.text
    malformed = client.post("/score", data={"csrf": csrf, "item_id": "../etc", "score": "3"})
    assert malformed.status_code == 400 and "item_id: is not an item id" in malformed.text
    forged = client.post("/score", data={"csrf": "forged", "item_id": item, "score": "3"})
    assert forged.status_code == 400 and "nothing was recorded" in forged.text
    assert store.status().annotators["ann"].scored == 0


def test_a_double_submit_is_409_and_the_first_score_stands(client: FlaskClient, store: AnnotationStore,
                                                           content: ContentStore) -> None:
    item = queue(store, content)
    log_in(client)
    form = {"csrf": csrf_of(client.get("/annotate").text), "item_id": item, "score": "4"}
    assert client.post("/score", data=form).status_code == 303
    again = client.post("/score", data={**form, "score": "1"})
    assert again.status_code == 409 and "already scored" in again.text and "first score stands" in again.text
    status = store.status()
    assert (status.annotators["ann"].scored, status.annotators["ann"].mean_score, status.completed) == (1, 4.0, 1)


def test_an_item_that_is_not_yours_is_409(client: FlaskClient, store: AnnotationStore,
                                          content: ContentStore) -> None:
    item = queue(store, content)
    assert store.next_item("lea").item_id == item  # type: ignore[union-attr]
    log_in(client)
    page = client.get("/annotate").text
    assert shown_item(page) is None  # its one slot is lea's
    reply = client.post("/score", data={"csrf": csrf_of(page), "item_id": item, "score": "2"})
    assert reply.status_code == 409 and "not assigned to ann" in reply.text


def test_the_lead_page_is_for_leads_only(client: FlaskClient, store: AnnotationStore, content: ContentStore) -> None:
    item = queue(store, content)
    queue(store, content)
    store.next_item("ann")
    store.submit_score("ann", item, 2.5)
    log_in(client)
    refused = client.get("/lead")
    assert refused.status_code == 403 and "lead_annotators" in refused.text
    assert 'href="/lead"' not in client.get("/annotate").text  # (which hands ann the second item)
    log_in(client, LEAD_TOKEN)
    page = client.get("/lead")
    assert page.status_code == 200
    assert re.search(r"queue depth<b>1</b>", page.text) and re.search(r"completed<b>1</b>", page.text)
    row = re.search(r'<tr data-annotator="ann">(.*?)</tr>', page.text, re.S)
    assert row and re.findall(r"<td>([^<]*)</td>", row.group(1))[:6] == ["ann", "1", "0", "2", "2.50", "yes"]
    assert "drift: not available" in page.text


def test_the_lead_page_shows_drift_and_an_alarm(store: AnnotationStore, tokens: TokenTable) -> None:
    drift = pytest.importorskip("svc_annotation.drift", reason="svc_annotation/drift.py is not there yet")
    tracker = drift.DriftTracker()
    for i in range(12):  # ann scores every gold item a point high: the CUSUM's upper arm fires
        tracker.observe(drift.Observation("ann", f"g{i}", 4.0, gold=3.0, model_reward=3.5))
        tracker.observe(drift.Observation("lea", f"g{i}", 3.0, gold=3.0))
    client = create_app(store, tokens, frozenset({"lea"}), drift=tracker).test_client()
    log_in(client, LEAD_TOKEN)
    page = client.get("/lead").text
    assert "drift: not available" not in page
    ann = re.search(r'<tr data-annotator="ann">(.*?)</tr>', page, re.S)
    lea = re.search(r'<tr data-annotator="lea">(.*?)</tr>', page, re.S)
    assert ann and "ALARM drift_up" in ann.group(1) and "+1.00" in ann.group(1)
    assert lea and "ALARM" not in lea.group(1) and ">ok<" in lea.group(1) and "100%" in lea.group(1)


def test_the_web_server_serves_https_with_the_grpc_certificate(store: AnnotationStore, tokens: TokenTable,
                                                               tmp_path: Path) -> None:
    from strata_tools.tlsgen import init_dev_pki

    pki = init_dev_pki(tmp_path / "pki")
    server = WebServer(create_app(store, tokens, secure_cookies=True), "127.0.0.1", 0,
                       (str(pki.server_cert), str(pki.server_key)))
    stop = threading.Event()
    thread = threading.Thread(target=server.run, args=(stop,))
    thread.start()
    try:
        context = ssl.create_default_context(cafile=str(pki.ca))
        assert server.url.startswith("https://")
        login = urllib.request.Request(f"https://localhost:{server.port}/login", data=f"token={ANN_TOKEN}".encode())
        opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context),
                                             _NoRedirect())
        with pytest.raises(urllib.error.HTTPError) as caught:
            opener.open(login, timeout=10)
        assert caught.value.code == 303
        cookie = caught.value.headers["Set-Cookie"]
        assert "Secure" in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    finally:
        stop.set()
        thread.join(10)
        server.close()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        return None


@pytest.fixture(autouse=True)
def _no_texts_in_logs(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """The page shows texts; it never logs them."""
    yield
    assert "bleach and vinegar" not in caplog.text and "chlorine gas" not in caplog.text


def test_the_pages_load_their_script_and_style_from_static_files_only(client: FlaskClient, store: AnnotationStore,
                                                                     content: ContentStore) -> None:
    queue(store, content)
    log_in(client)
    page = client.get("/annotate").text
    # The CSP allows 'self' only: anything inline would be blocked by the browser.
    assert "<style" not in page and re.search(r"<script(?![^>]*\bsrc=)", page) is None
    sources = re.findall(r'(?:src|href)="(/static/[^"]+)"', page)
    assert sorted(sources) == ["/static/annotation.css", "/static/keys.js"]
    for source in sources:
        served = client.get(source)
        assert served.status_code == 200 and served.data
        assert served.mimetype in ("text/css", "text/javascript", "application/javascript")
    assert 'data-next-url="/annotate"' in page
