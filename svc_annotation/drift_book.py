"""Annotators' drift state in Redis (R18): fed by the desk loop, read by every replica's pages.

The desk loop (one replica at a time, under its lease) feeds each closed item's scores to
``svc_annotation.drift`` and stores every annotator's ``AnnotatorState`` as JSON under
``<prefix>:drift:<annotator>``; the lead's page, ``Status`` and ``strata diagnose annotators`` read the
snapshots from there, so they agree whichever replica answers. Acknowledging an alarm (the lead)
restarts that annotator's tracking.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import redis
from prometheus_client import Gauge

from svc_annotation.drift import (
    Alarm,
    AnnotatorSnapshot,
    AnnotatorState,
    DriftSettings,
    Observation,
    Residuals,
    acknowledge,
    observe,
    snapshot,
)

DRIFT_GAUGE = Gauge("strata_annotation_drift", "Per-annotator drift figures over its window (R18)",
                    ["annotator", "figure"])
DRIFT_ALARM = Gauge("strata_annotation_drift_alarm", "1 while an annotator's drift alarm is on (R18)",
                    ["annotator"])


def state_to_json(state: AnnotatorState) -> str:
    return json.dumps(asdict(state))


def state_from_json(raw: str | bytes) -> AnnotatorState:
    data: dict[str, Any] = json.loads(raw)
    window = tuple(Residuals(r["item"], r["gold"], r["model"], tuple(r["peers"])) for r in data.pop("window"))
    alarm = data.pop("alarm")
    return AnnotatorState(**data, window=window, alarm=Alarm(**alarm) if alarm else None)


class DriftBook:
    def __init__(self, client: redis.Redis, prefix: str, settings: DriftSettings | None = None) -> None:
        self._redis = client
        self._prefix = f"{prefix}:drift:"
        self.settings = settings or DriftSettings()

    def _state(self, annotator: str) -> AnnotatorState:
        raw = self._redis.get(self._prefix + annotator)
        return state_from_json(raw) if raw else AnnotatorState(annotator)

    def feed_one(self, obs: Observation) -> AnnotatorSnapshot:
        """One annotator's score (``svc_annotation.worker.drift_observations``); its new snapshot."""
        state = observe(self._state(obs.annotator), obs, self.settings)
        self._redis.set(self._prefix + obs.annotator, state_to_json(state))
        current = snapshot(state, self.settings)
        export(current)
        return current

    def acknowledge(self, annotator: str) -> AnnotatorSnapshot:
        state = acknowledge(self._state(annotator))
        self._redis.set(self._prefix + annotator, state_to_json(state))
        current = snapshot(state, self.settings)
        export(current)
        return current

    def snapshots(self) -> list[AnnotatorSnapshot]:
        """Every annotator with a drift state, by name."""
        names = sorted(key.decode().removeprefix(self._prefix)
                       for key in self._redis.scan_iter(match=self._prefix + "*", count=200))
        return [snapshot(self._state(name), self.settings) for name in names]

    def drifting(self) -> frozenset[str]:
        """The annotators whose drift alarm holds now (their scores are left out of the human audit and the RMs'
        labels)."""
        return frozenset(a.annotator for a in self.snapshots() if a.alarm)


def export(current: AnnotatorSnapshot) -> None:
    """The snapshot's figures as Prometheus gauges (NaN where there is no value yet)."""
    for figure, value in current.gauges().items():
        DRIFT_GAUGE.labels(annotator=current.annotator, figure=figure).set(value)
    DRIFT_ALARM.labels(annotator=current.annotator).set(1.0 if current.alarm else 0.0)
