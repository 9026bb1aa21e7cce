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
item. One small inline script, allowed by a per-response CSP nonce; nothing is loaded from elsewhere.
"""

from __future__ import annotations

import functools
import hmac
import logging
import secrets
import threading
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Protocol

import redis
from flask import Flask, flash, g, redirect, render_template, request, session, url_for
from jinja2 import DictLoader
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


_BASE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{% block title %}{% endblock %} · Strata annotation</title>
<meta name="viewport" content="width=device-width, initial-scale=1">{% block head %}{% endblock %}
<style nonce="{{ g.nonce }}">
body { font: 15px/1.45 system-ui, sans-serif; margin: 0; color: #1d2430; background: #f4f5f7; }
header { display: flex; gap: 1em; align-items: center; padding: .6em 1.2em; background: #1d2430; color: #fff; }
header .who { margin-left: auto; } header a, header button { color: #cfe0ff; }
header form { display: inline; } header button { background: none; border: 0; font: inherit; cursor: pointer; }
main { max-width: 60em; margin: 1.2em auto; padding: 0 1.2em; }
.msg { padding: .6em .9em; border-radius: 6px; margin-bottom: 1em; }
.ok { background: #e3f4e6; } .error { background: #fde4e1; border: 1px solid #e8a49b; }
.card { background: #fff; border: 1px solid #d8dce3; border-radius: 8px; padding: .8em 1em; margin-bottom: 1em; }
.card h2 { font-size: .8em; text-transform: uppercase; letter-spacing: .06em; color: #6a7383; margin: 0 0 .4em; }
pre.text { white-space: pre-wrap; word-wrap: break-word; font: 15px/1.5 system-ui, sans-serif; margin: 0; }
.scores { display: flex; flex-wrap: wrap; gap: .35em; margin: .6em 0; }
.scores button { min-width: 3.2em; padding: .5em; font-size: 1em; border: 1px solid #9aa5b8; border-radius: 6px;
  background: #fff; cursor: pointer; } .scores button.whole { font-weight: 600; background: #eef3fc; }
.flags label { margin-right: 1.4em; } .keys, .muted { color: #6a7383; font-size: .9em; } kbd { background: #fff;
  border: 1px solid #c3c9d3; border-radius: 3px; padding: 0 .3em; font-size: .9em; }
table { border-collapse: collapse; width: 100%; background: #fff; } th, td { padding: .35em .6em;
  border-bottom: 1px solid #e1e4ea; text-align: right; } th:first-child, td:first-child { text-align: left; }
.figures { display: grid; grid-template-columns: repeat(auto-fill, minmax(7.4em, 1fr)); gap: .6em; }
.figures div { background: #fff; border: 1px solid #d8dce3; border-radius: 8px; padding: .5em .8em; }
.figures b { display: block; font-size: 1.6em; } .badge { border-radius: 4px; padding: .05em .45em; color: #fff; }
.ALARM { background: #c0392b; font-weight: 700; } .fine { background: #2e8b57; } .unjudged { background: #8a93a3; }
input[type=password] { font-size: 1em; padding: .4em; width: 24em; max-width: 100%; }
</style></head>
<body><header><b>Strata annotation</b>
{% if who %}<a href="{{ url_for('annotate') }}">Annotate</a>{% if is_lead %}<a href="{{ url_for('lead') }}">Lead</a>
{% endif %}<span class="who">{{ who }}</span><form method="post" action="{{ url_for('logout') }}">
<input type="hidden" name="csrf" value="{{ session.csrf }}"><button>Log out</button></form>{% endif %}</header>
<main>{% for category, text in get_flashed_messages(with_categories=true) %}<div class="msg {{ category }}">{{ text }}
</div>{% endfor %}{% if message %}<div class="msg error" role="alert" id="error">{{ message }}</div>{% endif %}
{% block main %}{% endblock %}</main>{% block script %}{% endblock %}</body></html>
"""

_LOGIN = """{% extends "base.html" %}{% block title %}Log in{% endblock %}{% block main %}
{% if not enabled %}<div class="msg error" role="alert" id="error">Web login is off: tokens must be configured
before anyone can log in. The operator sets <code>STRATA_GRPC_TOKENS_FILE</code> and gives each annotator a token
(<code>strata token new NAME --tokens-file FILE</code>).</div>{% else %}
<form method="post" action="{{ url_for('login') }}" class="card"><h2>Your annotator token</h2>
<p><input type="password" name="token" id="token" autocomplete="off" autofocus required>
<button id="login">Log in</button></p><p class="muted">The token your lead gave you (the same as for gRPC).</p>
</form>{% endif %}{% endblock %}
"""

_ANNOTATE = """{% extends "base.html" %}{% block title %}Annotate{% endblock %}
{% block head %}{% if not offer %}<meta http-equiv="refresh" content="{{ refresh_s }}">{% endif %}{% endblock %}
{% block main %}{% if offer %}
<div id="item" data-item-id="{{ offer.item_id }}">
<div class="card"><h2>Prompt</h2><pre class="text" id="prompt">{{ offer.prompt }}</pre></div>
<div class="card"><h2>Response</h2><pre class="text" id="response">{{ offer.response }}</pre></div>
<form method="post" action="{{ url_for('score') }}" id="score-form" class="card"><h2>Your score: 0 (useless or
wrong) to 5 (excellent)</h2><input type="hidden" name="csrf" value="{{ session.csrf }}">
<input type="hidden" name="item_id" value="{{ offer.item_id }}">
<div class="scores">{% for value in scores %}<button name="score" value="{{ value }}"
{% if '.' not in value %}class="whole"{% endif %}>{{ value }}</button>{% endfor %}</div>
<div class="flags"><label><input type="checkbox" name="unsafe" id="unsafe"> <u>u</u>nsafe</label>
<label><input type="checkbox" name="off_topic" id="off_topic"> <u>o</u>ff-topic</label></div>
<p class="muted">Yours until {{ until }} (UTC); then it may go to someone else.</p></form></div>
{% else %}<div class="card" id="empty"><h2>All done</h2><p>Nothing to annotate right now. This page looks again
every {{ refresh_s }} s; press <kbd>n</kbd> to look now.</p></div>{% endif %}
<p class="keys"><kbd>0</kbd>–<kbd>5</kbd> score and submit · <kbd>Shift</kbd>+<kbd>0</kbd>–<kbd>4</kbd> half a point
more · <kbd>u</kbd> unsafe · <kbd>o</kbd> off-topic · <kbd>n</kbd> or <kbd>Enter</kbd> next item</p>{% endblock %}
{% block script %}<script nonce="{{ g.nonce }}">
(function () {
  var form = document.getElementById("score-form"), busy = false;
  window.addEventListener("pageshow", function () { busy = false; });
  document.addEventListener("keydown", function (e) {
    var t = e.target;
    if (busy || e.ctrlKey || e.metaKey || e.altKey) return;
    if (t && (t.tagName === "TEXTAREA" || (t.tagName === "INPUT" && t.type !== "checkbox"))) return;
    var digit = /^[0-5]$/.test(e.key) ? e.key : (/^(?:Digit|Numpad)([0-5])$/.exec(e.code) || [])[1];
    if (form && digit !== undefined) {
      var value = Number(digit) + (e.shiftKey && digit !== "5" ? 0.5 : 0);
      var button = form.querySelector('button[value="' + value + '"]');
      if (button) { e.preventDefault(); busy = true; button.click(); }
    } else if (form && (e.key === "u" || e.key === "o")) {
      var box = document.getElementById(e.key === "u" ? "unsafe" : "off_topic");
      e.preventDefault(); box.checked = !box.checked;
    } else if (e.key === "n" || (e.key === "Enter" && t.tagName !== "BUTTON")) {
      e.preventDefault(); busy = true; window.location.assign("{{ url_for('annotate') }}");
    }
  });
})();
</script>{% endblock %}
"""

_LEAD = """{% extends "base.html" %}{% block title %}Lead{% endblock %}{% block main %}
<div class="figures" id="figures">
<div>queue depth<b>{{ desk.queue_depth }}</b></div><div>assigned now<b>{{ desk.assigned }}</b></div>
<div>queued<b>{{ desk.enqueued }}</b></div><div>completed<b>{{ desk.completed }}</b></div>
<div>expired<b>{{ desk.expired }}</b><span class="muted">provisional reward kept</span></div>
<div>gold items<b>{{ desk.gold_items }}</b></div><div>scores so far<b>{{ total_scores }}</b>
<span class="muted">gold included</span></div></div>
<p class="muted">Throughput: the desk counts completed items and scores since it began, not per hour; for a rate
use Prometheus, <code>rate(strata_annotation_scores_total[1h])</code> per annotator.</p>
<h3>Annotators</h3><table id="annotators"><tr><th>annotator</th><th>scored</th><th>gold scored</th>
<th>assignments</th><th>mean score</th><th>open item</th>{% if drift is not none %}<th>drift</th><th>gold n</th>
<th>bias vs gold</th><th>|error| vs gold</th><th>agrees with gold</th><th>with peers</th><th>with strong RM</th>
{% endif %}</tr>
{% for row in rows %}<tr data-annotator="{{ row.name }}"><td>{{ row.name }}</td>
{% if row.stats %}<td>{{ row.stats.scored }}</td><td>{{ row.stats.gold_scored }}</td>
<td>{{ row.stats.assignments }}</td>
<td>{{ "%.2f"|format(row.stats.mean_score) if row.stats.scored else "–" }}</td>
<td>{{ "yes" if row.stats.has_open_assignment else "" }}</td>{% else %}<td colspan="5" class="muted">not in the
desk's counts</td>{% endif %}
{% if drift is not none %}{% set s = row.drift %}{% if s %}<td>{% if s.alarm %}<span class="badge ALARM"
title="{{ s.status }} since item {{ s.alarm_since }}">ALARM {{ s.status }}</span>{% elif s.judged %}<span
class="badge fine">ok</span>{% else %}<span class="badge unjudged">not judged</span>{% endif %}</td>
<td>{{ s.gold.n }}</td><td>{{ signed(s.gold.bias) }}</td><td>{{ fixed(s.gold.mae) }}</td>
<td>{{ share(s.gold.within) }}</td><td>{{ share(s.peers.within) }}</td><td>{{ share(s.model.within) }}</td>
{% else %}<td colspan="7" class="muted">no scores tracked</td>{% endif %}{% endif %}</tr>
{% else %}<tr><td colspan="6" class="muted">No annotator has asked for an item yet.</td></tr>{% endfor %}
</table>
{% if drift is none %}<p class="card" id="drift">drift: not available (this process runs no drift tracker)</p>
{% else %}<p class="muted" id="drift">Drift: gold items only raise an ALARM (a CUSUM on the score minus the gold
score); peers and the strong RM are context. "not judged": too few gold items in the window yet.</p>{% endif %}
{% endblock %}
"""

_PLAIN = """{% extends "base.html" %}{% block title %}{{ title }}{% endblock %}{% block main %}
<p><a href="{{ url_for('annotate') }}">Back to annotating</a></p>{% endblock %}
"""

TEMPLATES = {"base.html": _BASE, "login.html": _LOGIN, "annotate.html": _ANNOTATE, "lead.html": _LEAD,
             "plain.html": _PLAIN}


def _signed(value: float | None) -> str:
    return "–" if value is None else f"{value:+.2f}"


def _fixed(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def _share(value: float | None) -> str:
    return "–" if value is None else f"{value:.0%}"


def create_app(store: AnnotationStore, tokens: TokenTable | None, leads: frozenset[str] = frozenset(),
               secret_key: str | None = None, secure_cookies: bool = False,
               drift: DriftSource | None = None) -> Flask:
    """The web app over ``store``; ``tokens`` None: nobody can log in. ``secret_key`` None: a random one."""
    app = Flask(__name__)
    app.jinja_loader = DictLoader(TEMPLATES)  # *.html names: Flask autoescapes them
    app.jinja_env.globals.update(signed=_signed, fixed=_fixed, share=_share)
    app.config.update(
        SECRET_KEY=secret_key or secrets.token_hex(32), SESSION_COOKIE_NAME="strata_annotation",
        SESSION_COOKIE_HTTPONLY=True, SESSION_COOKIE_SAMESITE="Strict", SESSION_COOKIE_SECURE=secure_cookies,
        PERMANENT_SESSION_LIFETIME=SESSION_LIFETIME, MAX_CONTENT_LENGTH=64 * 1024,
    )

    def signed_in() -> str | None:
        """The session's annotator while its token is still in the tokens file."""
        who, key = session.get("who"), session.get("key")
        if tokens is None or not isinstance(who, str) or not isinstance(key, str):
            return None
        try:
            digest = bytes.fromhex(key)
        except ValueError:
            return None
        return who if any(hmac.compare_digest(d, digest) and name == who for d, name in tokens.clients) else None

    def page(name: str, status: int = 200, **values: Any) -> tuple[str, int]:
        who = values.pop("who", None)
        return render_template(name, who=who, is_lead=who in leads, **values), status

    def annotator_page(view: Callable[..., Any]) -> Callable[..., Any]:
        """The view gets the signed-in annotator; without a session, the login page. POSTs must carry
        the session's CSRF token."""

        @functools.wraps(view)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            who = signed_in()
            if who is None:
                session.clear()
                return redirect(url_for("login"), 303)
            if request.method == "POST":
                sent, expected = request.form.get("csrf", ""), session.get("csrf", "")
                if not expected or not hmac.compare_digest(sent.encode(), str(expected).encode()):
                    return page("plain.html", 400, who=who, title="Stale form",
                                message="This form is stale or came from another site: nothing was recorded. "
                                        "Press n for the current item and score it again.")
            return view(who, *args, **kwargs)

        return wrapped

    def annotate_page(who: str, status: int = 200, message: str | None = None) -> tuple[str, int]:
        """The caller's item (its open assignment, else the next one) or the empty state."""
        try:
            offer = store.next_item(who)
        except ContentNotFoundError as exc:
            log.warning("annotation web: an item's texts are gone from the content store: %s", exc)
            return page("plain.html", 409, who=who, title="Texts missing",
                        message="This item's texts are gone from the content store; tell your lead. "
                                "It returns to the queue when your assignment goes stale.")
        until = None if offer is None else datetime.fromtimestamp(offer.assigned_until, timezone.utc).strftime("%H:%M")
        return page("annotate.html", status, who=who, offer=offer, until=until, scores=SCORES,
                    refresh_s=EMPTY_REFRESH_S, message=message)

    @app.before_request
    def _nonce() -> None:
        g.nonce = secrets.token_urlsafe(16)

    @app.after_request
    def _headers(response: Response) -> Response:
        nonce = getattr(g, "nonce", "")
        response.headers["Content-Security-Policy"] = (
            f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; form-action 'self'; "
            "frame-ancestors 'none'; base-uri 'none'")
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        response.headers["Cache-Control"] = "no-store"  # the texts stay off disk caches
        return response

    @app.errorhandler(redis.ConnectionError)
    @app.errorhandler(redis.TimeoutError)
    @app.errorhandler(StoreUnavailableError)
    def _unavailable(exc: Exception) -> tuple[str, int]:
        log.warning("annotation web: Redis unavailable: %s", exc)
        return page("plain.html", 503, who=signed_in(), title="Unavailable",
                    message="The annotation desk's Redis is unavailable: nothing was recorded. Try again shortly.")

    @app.get("/")
    def index() -> Response:
        return redirect(url_for("annotate" if signed_in() else "login"), 303)

    @app.route("/login", methods=["GET", "POST"])
    def login() -> Any:
        if tokens is None:
            return page("login.html", 503, enabled=False)
        if request.method == "GET":
            return page("login.html", enabled=True)
        token = request.form.get("token", "").strip()
        name = tokens.client_of(token) if token else None
        if name is None:
            log.info("annotation web: login refused (%s token) from %s", "unknown" if token else "no",
                     request.remote_addr)
            return page("login.html", 401, enabled=True,
                        message="Enter your token." if not token else "Unknown token: check it with your lead.")
        try:
            check_annotator(name)
        except InvalidRequestError as exc:
            return page("login.html", 403, enabled=True,
                        message=f"The token's client name cannot name an annotator ({exc.problem}).")
        session.clear()
        session.update(who=name, key=digest_of(token).hex(), csrf=secrets.token_urlsafe(24))
        session.permanent = True
        log.info("annotation web: %s logged in", name)
        return redirect(url_for("annotate"), 303)

    @app.post("/logout")
    @annotator_page
    def logout(who: str) -> Response:
        session.clear()
        log.info("annotation web: %s logged out", who)
        return redirect(url_for("login"), 303)

    @app.get("/annotate")
    @annotator_page
    def annotate(who: str) -> tuple[str, int]:
        return annotate_page(who)

    @app.post("/score")
    @annotator_page
    def score(who: str) -> Any:
        item_id, raw = request.form.get("item_id", ""), request.form.get("score", "").strip()
        try:
            try:
                value = float(raw)
            except ValueError:
                problem = f"must be a number from {SCORE_MIN:g} to {SCORE_MAX:g}, got {raw[:16]!r}"
                raise InvalidRequestError("score", problem if raw else "missing: press 0-5") from None
            count = store.submit_score(who, item_id, value, unsafe="unsafe" in request.form,
                                       off_topic="off_topic" in request.form)
        except DeskError as exc:
            status = next(code for kind, code in STATUS_OF.items() if isinstance(exc, kind))
            log.info("annotation web: score refused item=%r annotator=%s status=%d", item_id[:40], who, status)
            return annotate_page(who, status, f"Not recorded: {exc}")
        log.info("annotation web: score item=%s annotator=%s", item_id, who)
        flash(f"Scored {value:g}. {count} scored so far.", "ok")
        return redirect(url_for("annotate"), 303)

    @app.get("/lead")
    @annotator_page
    def lead(who: str) -> tuple[str, int]:
        if who not in leads:
            return page("plain.html", 403, who=who, title="Lead only",
                        message="The lead's page is for the annotators in lead_annotators; ask your lead.")
        status = store.status()
        snapshots = {s.annotator: s for s in drift.snapshots()} if drift is not None else {}
        rows = [{"name": name, "stats": status.annotators.get(name), "drift": snapshots.get(name)}
                for name in sorted(set(status.annotators) | set(snapshots))]
        total = sum(a.scored + a.gold_scored for a in status.annotators.values())
        return page("lead.html", who=who, desk=status, rows=rows, total_scores=total, drift=drift)

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
