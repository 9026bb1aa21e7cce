"""Settings of the annotation service (R3, R18, R20)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, model_validator

from strata.config import StrataSettings
from svc_annotation.core import ANNOTATOR_ID, Rules


class AnnotationSettings(StrataSettings):
    """``python -m svc_annotation``; every field is also ``STRATA_<NAME>``."""

    grpc_port: int = Field(50057, ge=0, le=65535)
    group_id: str = Field("svc-annotation", description="consumer group of the annotation-requested topic")
    redis_prefix: str = Field("strata:annotation", description="namespace of the annotation desk's Redis keys")
    redis_timeout_s: float = Field(5.0, gt=0, description="Redis socket timeout: calls fail fast when it is down")

    assignment_ttl_s: float = Field(
        600.0, gt=0, description="an assignment not scored within this goes back to the queue (another annotator "
        "may get it)"
    )
    annotation_deadline_s: float = Field(
        3600.0, gt=0, description="an item closes this long after it was queued: with the human scores it has, else "
        "the provisional (strong RM) reward becomes final"
    )
    double_share: float = Field(
        0.1, ge=0, le=1, description="share of items scored by two annotators (agreement), chosen by item id"
    )
    gold_share: float = Field(
        0.1, ge=0, le=1, description="share of each annotator's assignments that are gold items (known score, R18)"
    )
    gold_items_path: Path | None = Field(
        None, description="JSONL of gold items, one {\"prompt\", \"response\", \"score\"} per line; unset: the "
        "packaged default set (svc_annotation/data/gold.jsonl: 48 suite answers scored by the oracle); gold_share 0 "
        "turns gold items off"
    )
    item_retention_s: int = Field(
        7 * 24 * 3600, ge=60, description="how long a closed item (and its scores) is kept: a redelivered request "
        "within this adds nothing"
    )
    loop_interval_s: float = Field(1.0, gt=0, description="period of the loop that closes due items and publishes")
    human_audit: bool = Field(
        True, description="tally people's scores of Level-1 answers (annotate_level1_share) beside the light RM's "
        "reward of the same answers, per policy version: the live audit's second judge (strata.audit), which the "
        "reward service's hacking alarm and defence read too")
    human_bad_below: float = Field(
        3.2, ge=0, le=5, description="a Level-1 answer whose mean human score is under this counts as bad in the "
        "human audit's catch and false-pass estimates (the brief's escalation threshold)")
    human_audit_ttl_s: int = Field(7 * 24 * 3600, ge=1, description="how long a policy version's human audit tally "
                                   "is kept")
    human_audit_labels_kept: int = Field(
        50_000, ge=0, description="audited answers kept one by one (people's mean score, the light RM's, the route, "
        "the bad call), for a tool that checks the audit against another judge on the same answers; 0: none")
    loop_batch: int = Field(64, ge=1, description="items closed and published per loop pass at most")
    publisher_lease_s: float = Field(
        30.0, gt=0, description="one replica at a time publishes; another takes over this long after it stops"
    )

    # The web page (svc_annotation/web.py, docs/annotation.md): annotators log in with their gRPC token.
    web_port: int = Field(
        8057, ge=0, le=65535, description="annotators' web page and the lead's (HTTPS when grpc_tls_cert/key are "
        "set); 0: no web page"
    )
    web_bind_host: str = Field(
        "127.0.0.1", description="address the web page listens on; 0.0.0.0 for every interface (compose)"
    )
    web_secret_key: SecretStr | None = Field(
        None, description="signs the web session cookies (env only); give every replica behind one "
        "address the same; unset: a random key per start (everyone logs in again after a restart)"
    )
    lead_annotators: str = Field(
        "", description="comma-separated annotator names that may open the lead's page (/lead)"
    )

    @model_validator(mode="after")
    def _check_web(self) -> AnnotationSettings:
        if self.web_secret_key is not None and len(self.web_secret_key.get_secret_value()) < 16:
            raise ValueError("web_secret_key must be at least 16 characters (python -c 'import secrets; "
                             "print(secrets.token_urlsafe(32))')")
        for name in self.leads():
            if not ANNOTATOR_ID.fullmatch(name):
                raise ValueError(f"lead_annotators: {name!r} is not an annotator name "
                                 "(1-64 letters, digits or . _ @ -)")
        return self

    def leads(self) -> frozenset[str]:
        return frozenset(name.strip() for name in self.lead_annotators.split(",") if name.strip())

    @model_validator(mode="after")
    def _check_retention(self) -> AnnotationSettings:
        if self.item_retention_s <= self.annotation_deadline_s:
            raise ValueError(f"item_retention_s ({self.item_retention_s}) must exceed annotation_deadline_s "
                             f"({self.annotation_deadline_s:g}): an open item must not expire from Redis")
        return self

    def rules(self) -> Rules:
        return Rules(self.double_share, self.gold_share, self.assignment_ttl_s, self.annotation_deadline_s)
