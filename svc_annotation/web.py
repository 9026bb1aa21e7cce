"""The annotators' web page and the lead's (R3, R18): Flask, server-rendered, in the service's process.

    GET  /login      the login form; POST: a token -> a session (401: missing or unknown token)
    POST /logout     end the session
    GET  /annotate   the caller's item (prompt, response, score 0-5 in halves, flags), or "nothing to annotate"
    POST /score      record a score, then the next item; refusals show on the page: 400 a bad score or item
                     id, 404 an unknown item, 409 already scored / not (or no longer) yours / closed,
                     503 Redis down (nothing recorded)
    GET  /lead       the queue, throughput, per-annotator counts and drift (``lead_annotators`` only, else 403)

Who is calling: the client name of the token an annotator logs in with, looked up in the gRPC edge's
tokens file (``grpc_tokens_file``), so a person has one token for both. Without a tokens file nobody
can log in: the page is never open to anyone. The session is a signed cookie (HttpOnly, SameSite=Strict,
Secure under HTTPS) holding the name, the token's digest (a token dropped from the file at a restart
ends its sessions) and a CSRF token every form posts back.

The page calls the store directly, not gRPC; the store's errors (``svc_annotation.core``) decide the
status. Texts are shown here and in gRPC ``Next`` only: autoescaped, never logged, never cached.
Keyboard: 0-5 score and submit (Shift+0-4: a half more), u unsafe, o off-topic, n or Enter the next
item. The pages are ``templates/*.html``; their stylesheet and the keyboard script are ``static/``, the
only scripts and styles the CSP allows (nothing inline, nothing from elsewhere).
"""

from __future__ import annotations

import functools
import hmac
import logging
import secrets
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Protocol, cast

import redis
from flask import Flask, current_app, flash, redirect, render_template, request, session, url_for
from werkzeug.serving import make_server
from werkzeug.wrappers import Response

from strata.content_store import ContentNotFoundError, StoreUnavailableError
from strata.rpc_auth import TokenTable, digest_of
from svc_annotation.core import (
    SCORE_MAX,
    SCORE_MIN,
    AlreadyScoredError,
    DeskError,
    InvalidRequestError,
    NotAssignedError,
    UnknownItemError,
    check_annotator,
)
from svc_annotation.store import AnnotationStore

if TYPE_CHECKING:
    from svc_annotation.drift import AnnotatorSnapshot

log = logging.getLogger(__name__)

SESSION_LIFETIME = timedelta(hours=12)  # an annotator's working day; then the token again
EMPTY_REFRESH_S = 30  # the "nothing to annotate" page looks again this often
# The buttons: every half point from SCORE_MIN to SCORE_MAX, as the keyboard script names them ("0", "0.5", ...).
SCORES = [f"{SCORE_MIN + i / 2:g}" for i in range(int((SCORE_MAX - SCORE_MIN) * 2) + 1)]
STATUS_OF: dict[type[DeskError], int] = {
    InvalidRequestError: 400, UnknownItemError: 404, AlreadyScoredError: 409, NotAssignedError: 409,
}


class DriftSource(Protocol):
    """What the lead's page reads of the drift tracker (``svc_annotation.drift.DriftTracker``)."""

    def snapshots(self) -> Sequence[AnnotatorSnapshot]: ...


def _signed(value: float | None) -> str:
    return "–" if value is None else f"{value:+.2f}"


def _fixed(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def _share(value: float | None) -> str:
    return "–" if value is None else f"{value:.0%}"


@dataclass(frozen=True)
class _Desk:
    """What the views read, set once per app (``create_app``)."""

    store: AnnotationStore
    tokens: TokenTable | None  # None: nobody can log in
    leads: frozenset[str]
    drift: DriftSource | None


def _desk() -> _Desk:
    return cast(_Desk, current_app.extensions["strata_annotation"])


def _signed_in() -> str | None:
    """The session's annotator while its token is still in the tokens file."""
    tokens = _desk().tokens
    who, key = session.get("who"), session.get("key")
    if tokens is None or not isinstance(who, str) or not isinstance(key, str):
        return None
    try:
        digest = bytes.fromhex(key)
    except ValueError:
        return None
    return who if any(hmac.compare_digest(d, digest) and name == who for d, name in tokens.clients) else None


def _page(name: str, status: int = 200, **values: Any) -> tuple[str, int]:
    who = values.pop("who", None)
    return render_template(name, who=who, is_lead=who in _desk().leads, **values), status


def _annotator_page(view: Callable[..., Any]) -> Callable[..., Any]:
    """The view gets the signed-in annotator; without a session, the login page. POSTs must carry
    the session's CSRF token."""

    @functools.wraps(view)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        who = _signed_in()
        if who is None:
            session.clear()
            return redirect(url_for("login"), 303)
        if request.method == "POST":
            sent, expected = request.form.get("csrf", ""), session.get("csrf", "")
            if not expected or not hmac.compare_digest(sent.encode(), str(expected).encode()):
                return _page("plain.html", 400, who=who, title="Stale form",
                             message="This form is stale or came from another site: nothing was recorded. "
                                     "Press n for the current item and score it again.")
        return view(who, *args, **kwargs)

    return wrapped


def _annotate_page(who: str, status: int = 200, message: str | None = None) -> tuple[str, int]:
    """The caller's item (its open assignment, else the next one) or the empty state."""
    try:
        offer = _desk().store.next_item(who)
    except ContentNotFoundError as exc:
        log.warning("annotation web: an item's texts are gone from the content store: %s", exc)
        return _page("plain.html", 409, who=who, title="Texts missing",
                     message="This item's texts are gone from the content store; tell your lead. "
                             "It returns to the queue when your assignment goes stale.")
    until = None if offer is None else datetime.fromtimestamp(offer.assigned_until, timezone.utc).strftime("%H:%M")
    return _page("annotate.html", status, who=who, offer=offer, until=until, scores=SCORES,
                 refresh_s=EMPTY_REFRESH_S, message=message)


def _headers(response: Response) -> Response:
    response.headers["Content-Security-Policy"] = (
        "default-src 'none'; script-src 'self'; style-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'")
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    if request.endpoint != "static":
        response.headers["Cache-Control"] = "no-store"  # the texts stay off disk caches
    return response


def _unavailable(exc: Exception) -> tuple[str, int]:
    log.warning("annotation web: Redis unavailable: %s", exc)
    return _page("plain.html", 503, who=_signed_in(), title="Unavailable",
                 message="The annotation desk's Redis is unavailable: nothing was recorded. Try again shortly.")


def index() -> Response:
    return redirect(url_for("annotate" if _signed_in() else "login"), 303)


def login() -> Any:
    tokens = _desk().tokens
    if tokens is None:
        return _page("login.html", 503, enabled=False)
    if request.method == "GET":
        return _page("login.html", enabled=True)
    token = request.form.get("token", "").strip()
    name = tokens.client_of(token) if token else None
    if name is None:
        log.info("annotation web: login refused (%s token) from %s", "unknown" if token else "no",
                 request.remote_addr)
        return _page("login.html", 401, enabled=True,
                     message="Enter your token." if not token else "Unknown token: check it with your lead.")
    try:
        check_annotator(name)
    except InvalidRequestError as exc:
        return _page("login.html", 403, enabled=True,
                     message=f"The token's client name cannot name an annotator ({exc.problem}).")
    session.clear()
    session.update(who=name, key=digest_of(token).hex(), csrf=secrets.token_urlsafe(24))
    session.permanent = True
    log.info("annotation web: %s logged in", name)
    return redirect(url_for("annotate"), 303)


@_annotator_page
def logout(who: str) -> Response:
    session.clear()
    log.info("annotation web: %s logged out", who)
    return redirect(url_for("login"), 303)


@_annotator_page
def annotate(who: str) -> tuple[str, int]:
    return _annotate_page(who)


@_annotator_page
def score(who: str) -> Any:
    item_id, raw = request.form.get("item_id", ""), request.form.get("score", "").strip()
    try:
        try:
            value = float(raw)
        except ValueError:
            problem = f"must be a number from {SCORE_MIN:g} to {SCORE_MAX:g}, got {raw[:16]!r}"
            raise InvalidRequestError("score", problem if raw else "missing: press 0-5") from None
        count = _desk().store.submit_score(who, item_id, value, unsafe="unsafe" in request.form,
                                           off_topic="off_topic" in request.form)
    except DeskError as exc:
        status = next(code for kind, code in STATUS_OF.items() if isinstance(exc, kind))
        log.info("annotation web: score refused item=%r annotator=%s status=%d", item_id[:40], who, status)
        return _annotate_page(who, status, f"Not recorded: {exc}")
    log.info("annotation web: score item=%s annotator=%s", item_id, who)
    flash(f"Scored {value:g}. {count} scored so far.", "ok")
    return redirect(url_for("annotate"), 303)


@_annotator_page
def lead(who: str) -> tuple[str, int]:
    desk = _desk()
    if who not in desk.leads:
        return _page("plain.html", 403, who=who, title="Lead only",
                     message="The lead's page is for the annotators in lead_annotators; ask your lead.")
    status = desk.store.status()
    snapshots = {s.annotator: s for s in desk.drift.snapshots()} if desk.drift is not None else {}
    rows = [{"name": name, "stats": status.annotators.get(name), "drift": snapshots.get(name)}
            for name in sorted(set(status.annotators) | set(snapshots))]
    total = sum(a.scored + a.gold_scored for a in status.annotators.values())
    return _page("lead.html", who=who, desk=status, rows=rows, total_scores=total, drift=desk.drift)


ROUTES: tuple[tuple[str, Callable[..., Any], tuple[str, ...]], ...] = (
    ("/", index, ("GET",)), ("/login", login, ("GET", "POST")), ("/logout", logout, ("POST",)),
    ("/annotate", annotate, ("GET",)), ("/score", score, ("POST",)), ("/lead", lead, ("GET",)),
)


def create_app(store: AnnotationStore, tokens: TokenTable | None, leads: frozenset[str] = frozenset(),
               secret_key: str | None = None, secure_cookies: bool = False,
               drift: DriftSource | None = None) -> Flask:
    """The web app over ``store``; ``tokens`` None: nobody can log in. ``secret_key`` None: a random one."""
    app = Flask(__name__)  # templates/ and static/ beside this module; *.html templates are autoescaped
    app.jinja_env.globals.update(signed=_signed, fixed=_fixed, share=_share)
    app.config.update(
        SECRET_KEY=secret_key or secrets.token_hex(32), SESSION_COOKIE_NAME="strata_annotation",
        SESSION_COOKIE_HTTPONLY=True, SESSION_COOKIE_SAMESITE="Strict", SESSION_COOKIE_SECURE=secure_cookies,
        PERMANENT_SESSION_LIFETIME=SESSION_LIFETIME, MAX_CONTENT_LENGTH=64 * 1024,
    )
    app.extensions["strata_annotation"] = _Desk(store, tokens, leads, drift)
    app.after_request(_headers)
    for unavailable in (redis.ConnectionError, redis.TimeoutError, StoreUnavailableError):
        app.register_error_handler(unavailable, _unavailable)
    for rule, view, methods in ROUTES:
        app.add_url_rule(rule, view_func=view, methods=list(methods))
    return app


class WebServer:
    """The app on werkzeug's threaded server: bound at construction (a taken port fails the start),
    served while the service runs (``run`` is one of its loops), closed with it."""

    def __init__(self, app: Flask, host: str, port: int, tls: tuple[str, str] | None = None) -> None:
        self._server = make_server(host, port, app, threaded=True, ssl_context=tls)
        self.url = f"{'https' if tls else 'http'}://{host}:{self.port}"

    @property
    def port(self) -> int:
        return int(self._server.server_port)

    def run(self, stop: threading.Event) -> None:
        thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                  name="annotation-web", daemon=True)
        thread.start()
        log.info("annotation web page on %s", self.url)
        stop.wait()
        self._server.shutdown()  # returns once serve_forever has; requests in flight finish in their threads
        thread.join()

    def close(self) -> None:
        self._server.server_close()
