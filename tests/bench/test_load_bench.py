"""``strata bench load``: the open-loop client against scripted in-process schedulers (it keeps the offered
rate when the server slows, and records refusals with their codes and retry hints), and the pure pieces:
the knee, the bottleneck, the overload's accounting, the prompt pools and the flags."""

from __future__ import annotations

import argparse
import itertools
import math
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import replace
from types import SimpleNamespace

import grpc
import pytest
from benchargs import default_args

from strata.errors import CliError
from strata.rpc import RETRY_PUSHBACK_KEY
from strata.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from strata_tools.bench import load
from strata_tools.bench.load.client import (
    Call,
    OpenLoopClient,
    Reply,
    grpc_submitter,
    pushback_s,
    retry_hint_s,
    send_offsets,
)
from strata_tools.bench.load.figures import (
    Accounting,
    Sample,
    StepFigures,
    account,
    bottleneck,
    final_latencies_ms,
    knee,
    last_line,
    past_knee,
    report,
    step_figures,
    within_bound,
)
from strata_tools.bench.load.phases import (
    WARMUP_PROMPTS_PER_FAMILY,
    HeldFigures,
    Plan,
    Pools,
    held_figures,
    skip_prompts,
    split_pools,
)
from strata_tools.bench.load.stack import stack_reader
from strata_tools.infra.process import cpu_seconds, open_fds, rss_bytes, thread_count

# -- scripted schedulers, in process ------------------------------------------------------------------------


class SlowScheduler(scheduler_pb2_grpc.SchedulerServicer):
    """Accepts every prompt after ``delay_s``: a server far slower than the offered interval."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.received: list[str] = []
        self.lock = threading.Lock()

    def Submit(self, request: scheduler_pb2.SubmitRequest, context: grpc.ServicerContext
               ) -> scheduler_pb2.SubmitResponse:
        with self.lock:
            self.received.append(request.request_id)
        time.sleep(self.delay_s)  # the scripted slowness under test, not a wait for another thread
        return scheduler_pb2.SubmitResponse(request_id=request.request_id, decision=common_pb2.DECISION_LEVEL_1)


class RefusingScheduler(scheduler_pb2_grpc.SchedulerServicer):
    """Answers by the request id's first word: ``exhausted`` (RESOURCE_EXHAUSTED with gRPC's pushback trailer),
    ``unavailable`` (UNAVAILABLE with "retry in X s" in its details), ``broken`` (INTERNAL, no hint), else OK
    with a skip."""

    def Submit(self, request: scheduler_pb2.SubmitRequest, context: grpc.ServicerContext
               ) -> scheduler_pb2.SubmitResponse:
        kind = request.request_id.split("-")[0]
        if kind == "exhausted":
            context.set_trailing_metadata(((RETRY_PUSHBACK_KEY, "1500"),))
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "the tiers are behind")
        if kind == "unavailable":
            context.abort(grpc.StatusCode.UNAVAILABLE, "Kafka did not acknowledge the prompt; retry in 2.50 s")
        if kind == "broken":
            context.abort(grpc.StatusCode.INTERNAL, "something else")
        return scheduler_pb2.SubmitResponse(request_id=request.request_id, decision=common_pb2.DECISION_SKIP)


@pytest.fixture
def serve() -> Iterator:
    """Starts a servicer on a free local port; yields a function giving a SchedulerStub to it."""
    servers, channels = [], []

    def start(servicer: scheduler_pb2_grpc.SchedulerServicer) -> scheduler_pb2_grpc.SchedulerStub:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=32))
        scheduler_pb2_grpc.add_SchedulerServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        channels.append(grpc.insecure_channel(f"127.0.0.1:{port}"))
        return scheduler_pb2_grpc.SchedulerStub(channels[-1])

    yield start
    for channel in channels:
        channel.close()
    for server in servers:
        server.stop(grace=None)


def _requests(prefix: str = "r") -> Iterator[tuple[str, str]]:
    return ((f"{prefix}-{i}", f"prompt {i}") for i in itertools.count())


# -- the open-loop client -----------------------------------------------------------------------------------

def test_the_client_keeps_the_offered_rate_when_each_call_takes_far_longer_than_the_interval(serve) -> None:
    server = SlowScheduler(delay_s=0.3)  # six times the 50 ms interval of 20/s
    client = OpenLoopClient(grpc_submitter(serve(server), timeout_s=10), workers=16)
    try:
        calls = client.run(send_offsets(20, 1.5, seed=0, poisson=False), _requests())
    finally:
        client.close()
    assert len(calls) == 30 and len(server.received) == 30 and all(c.accepted for c in calls)
    assert min(c.latency_ms for c in calls) >= 300
    # Every send left on schedule, well within one call's 0.3 s (a loaded machine's thread wake-ups allowed),
    # so the sends spanned about the 1.45 s the schedule did: a closed-loop client waiting for each reply
    # would have sent 5 in that time.
    assert max(c.sent_at - c.scheduled_at for c in calls) < 0.2
    assert 1.3 < calls[-1].sent_at - calls[0].sent_at < 1.8
    assert [c.reply.decision for c in calls[:1]] == ["DECISION_LEVEL_1"]


def test_a_pool_that_cannot_keep_up_records_how_late_it_sent_instead_of_sending_less(serve) -> None:
    # One worker is a closed loop: each send waits for the previous reply (0.3 s) where the schedule says 0.1 s.
    client = OpenLoopClient(grpc_submitter(serve(SlowScheduler(delay_s=0.3)), timeout_s=10), workers=1)
    try:
        calls = client.run(send_offsets(10, 0.5, seed=0, poisson=False), _requests())
    finally:
        client.close()
    assert len(calls) == 5  # all of them offered ...
    assert calls[-1].sent_at - calls[-1].scheduled_at > 0.7  # ... and the last one 4 x 0.3 - 0.4 s late
    figures = step_figures("fresh", 10, calls[0].scheduled_at, 0.5, calls, [], [], None)
    assert figures.send_late_p99_ms > 700
    assert figures.sent_per_s < 10  # what went out within the step, not what was offered


def test_refusals_are_counted_by_code_with_their_retry_hints(serve) -> None:
    client = OpenLoopClient(grpc_submitter(serve(RefusingScheduler()), timeout_s=10), workers=4)
    kinds = ["exhausted", "exhausted", "unavailable", "broken", "ok"]
    requests = ((f"{kind}-{i}", "a prompt") for i, kind in enumerate(kinds))
    try:
        calls = client.run([0.0] * len(kinds), requests)
    finally:
        client.close()
    replies = {c.request_id: c.reply for c in calls}
    assert replies["exhausted-0"] == Reply("RESOURCE_EXHAUSTED", retry_hint_s=1.5, pushback=True)
    assert replies["unavailable-2"] == Reply("UNAVAILABLE", retry_hint_s=2.5)  # a hint, in the details only
    assert replies["broken-3"] == Reply("INTERNAL")
    assert replies["ok-4"] == Reply("OK", decision="DECISION_SKIP")
    figures = step_figures("skip", 5, calls[0].scheduled_at, 1.0, calls, [], [], None)
    assert figures.refused_per_s == {"RESOURCE_EXHAUSTED": 2.0, "UNAVAILABLE": 1.0, "INTERNAL": 1.0}
    assert figures.accepted_per_s == 1.0 and figures.skip_share == 1.0 and figures.decisions == {"DECISION_SKIP": 1}
    accounting = account(calls, {"ok-4": [calls[-1].sent_at + 1.0]}, deadline_s=60)
    assert (accounting.refused, accounting.with_hint, accounting.bad_refusals) == (4, 3, 1)
    assert accounting.refused_by_code == {"RESOURCE_EXHAUSTED": 2, "UNAVAILABLE": 1, "INTERNAL": 1}
    assert accounting.pushback_by_code == {"RESOURCE_EXHAUSTED": 2} and accounting.with_pushback == 2
    assert (accounting.accepted, accounting.lost, accounting.doubled) == (1, 0, 0)


@pytest.mark.parametrize(("metadata", "details", "hint", "trailer"), [
    ([("grpc-retry-pushback-ms", b"250")], "", 0.25, 0.25),
    ([("other", "1"), ("grpc-retry-pushback-ms", "2000")], "retry in 9 s", 2.0, 2.0),  # the trailer wins
    ([("grpc-retry-pushback-ms", "-1")], "", None, None),  # negative: gRPC's "do not retry"
    ([("grpc-retry-pushback-ms", "soon")], "retry in 4 s", 4.0, None),  # unreadable: the details
    ([], "over its Submit rate (3 prompts/s, burst 10); retry in 0.33 s", 0.33, None),
    ([], "the tiers are behind", None, None),
])
def test_retry_hints_come_from_the_pushback_trailer_or_the_details(metadata: list, details: str,
                                                                    hint: float | None, trailer: float | None) -> None:
    assert retry_hint_s(metadata, details) == hint
    assert pushback_s(metadata) == trailer


def test_poisson_send_times_are_seeded_and_average_the_offered_rate() -> None:
    offsets = send_offsets(50, 200, seed=3)
    assert offsets == send_offsets(50, 200, seed=3) != send_offsets(50, 200, seed=4)
    assert abs(len(offsets) - 10_000) < 400  # Poisson: SD 100
    assert offsets == sorted(offsets) and offsets[0] >= 0 and offsets[-1] < 200
    assert send_offsets(4, 2.5, seed=0, poisson=False) == [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.25]


# -- the knee, the bottleneck and the overload's accounting (pure) -------------------------------------------

def step(rate: float, p99_ms: float, accepted_per_s: float | None = None, growth: dict | None = None,
         cpu: dict | None = None, mix: str = "fresh", sent_per_s: float | None = None) -> StepFigures:
    sent = rate if sent_per_s is None else sent_per_s
    accepted = sent if accepted_per_s is None else accepted_per_s
    return StepFigures(mix=mix, offered_rate=rate, sent_per_s=sent, accepted_per_s=accepted,
                       accepted_share=accepted / sent, refused_per_s={},
                       skip_share=0.0, send_late_p99_ms=1.0, submit_p50_ms=5.0, submit_p99_ms=9.0,
                       final_p50_ms=p99_ms / 2, final_p99_ms=p99_ms, late=0, lag_growth=growth or {},
                       cpu_per_s=cpu or {})


def test_the_knee_is_the_highest_rate_below_the_first_that_misses_the_bound() -> None:
    steps = [step(4, 29_000), step(1, 3_000), step(2, 5_000), step(8, float("inf")), step(16, 20_000)]
    assert knee(steps, 30_000).offered_rate == 4  # 16/s making it again above a miss is noise
    assert knee(steps, 4_000).offered_rate == 1
    assert knee(steps, 2_000) is None
    # Refusing most of the offered rate is no way under the knee: 8/s accepting 7 of 8 misses (90 %).
    assert knee([step(4, 1_000), step(8, 1_000, accepted_per_s=7.0)], 30_000).offered_rate == 4
    assert knee([step(4, 1_000), step(8, 1_000, accepted_per_s=7.2)], 30_000).offered_rate == 8
    # The share is of the requests the step offered: a Poisson schedule of 20 s at 2/s that happened to
    # offer 31, every one accepted, makes it (the ci run's first step missed on 1.55/s against 2/s).
    calls = [call(f"r{i}", 100.0 + i * 0.6) for i in range(31)]
    quiet = step_figures("skip", 2, 100.0, 20.0, calls, [400.0] * 31, [], None)
    assert quiet.accepted_per_s == 1.55 and quiet.accepted_share == 1.0 and within_bound(quiet, 30_000)
    refusing = step_figures("skip", 2, 100.0, 20.0, calls + [call("no", 110.0, "RESOURCE_EXHAUSTED", 1.0)] * 4,
                            [400.0] * 31, [], None)
    assert refusing.accepted_share == 31 / 35 and not within_bound(refusing, 30_000)


def test_the_bottleneck_is_the_group_whose_lag_grew_most_past_the_knee_else_the_busiest_service() -> None:
    steps = [step(1, 1_000, growth={"probe": 5}),
             step(2, 90_000, growth={"probe": 3, "generator-l1": 40, "reward": 12, "scheduler": 0}),
             step(4, float("inf"), growth={"reward": 400})]
    assert past_knee(steps, 30_000).offered_rate == 2
    assert bottleneck(past_knee(steps, 30_000)) == ("generator-l1", "lag")
    tied = step(2, 90_000, growth={"probe": 1, "reward": 1, "scheduler": 0}, cpu={"probe": 0.1, "reward": 0.3})
    assert bottleneck(tied) == ("reward", "lag")  # a batch in flight each: the busier one
    quiet = step(2, 90_000, growth={"probe": 0, "reward": -2}, cpu={"probe": 0.2, "reward": 0.9, "scheduler": 0.4})
    assert bottleneck(quiet) == ("reward", "cpu")
    # No step misses: the highest rate is read.
    assert past_knee([step(1, 1_000), step(2, 2_000, growth={"reward": 1})], 30_000).offered_rate == 2
    assert bottleneck(None) == ("none", "")


def call(request_id: str, sent_at: float, code: str = "OK", hint: float | None = None, pushback: bool = False
         ) -> Call:
    return Call(request_id, scheduled_at=sent_at, sent_at=sent_at, latency_ms=3.0,
                reply=Reply(code, hint, pushback=pushback))


def test_the_overload_counts_lost_doubled_and_badly_refused_requests() -> None:
    calls = [call("served", 0.0), call("late", 0.0), call("never", 1.0), call("twice", 2.0),
             call("full", 2.0, "RESOURCE_EXHAUSTED", 0.5, pushback=True), call("down", 2.0, "UNAVAILABLE"),
             call("timed-out", 3.0, "DEADLINE_EXCEEDED"), call("taken-anyway", 3.0, "UNAVAILABLE", 1.0)]
    arrivals = {"served": [50.0], "late": [61.0], "twice": [10.0, 11.0], "taken-anyway": [20.0],
                "someone-else": [5.0]}
    result = account(calls, arrivals, deadline_s=60)
    assert result == Accounting(accepted=4, refused=4, lost=2, doubled=1, bad_refusals=1, with_hint=2,
                                served_refused=1,
                                refused_by_code={"RESOURCE_EXHAUSTED": 1, "UNAVAILABLE": 2, "DEADLINE_EXCEEDED": 1},
                                pushback_by_code={"RESOURCE_EXHAUSTED": 1})
    assert final_latencies_ms(calls, arrivals, 60) == [50_000.0, float("inf"), float("inf"), 8_000.0]


def test_a_late_send_counts_its_lateness_in_the_time_to_final_reward() -> None:
    # Scheduled at 0, sent at 4 by a pool that could not keep up, final at 5: the request waited 5 s, not 1.
    late = Call("late", scheduled_at=0.0, sent_at=4.0, latency_ms=3.0, reply=Reply("OK", None))
    assert final_latencies_ms([late], {"late": [5.0]}, 60) == [5_000.0]


def test_step_figures_read_lag_rss_and_redis_from_the_samples_taken_while_sending() -> None:
    calls = [call("a", 10.0), call("b", 10.5, "RESOURCE_EXHAUSTED"), call("c", 11.0)]
    before = Sample(9.0, {"probe": 2, "reward": 0}, {}, 0)
    during = [Sample(10.2, {"probe": 4, "reward": 1}, {"probe": 100 * 2**20}, 3 * 2**20),
              Sample(11.2, {"probe": 3, "reward": 9}, {"probe": 120 * 2**20}, 2 * 2**20)]
    figures = step_figures("fresh", 3, 10.0, 2.0, calls, [1_000.0, float("inf")], during, before)
    assert figures.max_lag == {"probe": 4, "reward": 9} and figures.lag_growth == {"probe": 2, "reward": 9}
    assert figures.rss_mb == {"probe": 120.0} and figures.redis_mb == 3.0
    assert (figures.accepted_per_s, figures.refused_per_s, figures.late) == (1.0, {"RESOURCE_EXHAUSTED": 0.5}, 1)
    assert figures.final_p99_ms == float("inf") and figures.sent_per_s == 1.5


def test_the_last_line_names_the_knees_the_overload_and_the_bottleneck() -> None:
    skip_steps = [replace(step(1, 900, mix="skip"), decisions={"DECISION_SKIP": 2, "DECISION_LEVEL_2": 2}),
                  replace(step(2, 1_000, mix="skip"), decisions={"DECISION_SKIP": 4})]
    steps = {"skip": skip_steps,
             "fresh": [step(1, 12_345), step(2, 40_000, growth={"generator-l1": 30})]}
    overload = Accounting(accepted=30, refused=10, lost=0, doubled=0, bad_refusals=0, with_hint=5, served_refused=0,
                          refused_by_code={"UNAVAILABLE": 2, "RESOURCE_EXHAUSTED": 8},
                          pushback_by_code={"RESOURCE_EXHAUSTED": 4})
    line = last_line(steps, overload, 42.4, 30_000, 10.0)
    assert line == ("load knee_skip=2 knee_fresh=1 p99_final_ms=12345 overload_lost=0 overload_doubled=0 "
                    "bottleneck=generator-l1 shed_wait_s=10 bottleneck_by=lag overload_refused=10 "
                    "overload_refused_by=RESOURCE_EXHAUSTED:8,UNAVAILABLE:2 overload_bad_refusals=0 "
                    "retry_hint_share=0.500 pushback_share=0.400 drained_s=42 p99_bound_ms=30000 "
                    "skip_mix_skipped=0.750")
    none = last_line({"fresh": [step(1, float("inf"))]}, overload, None, 30_000, 0.0)
    assert " shed_wait_s=0 " in none
    assert none.startswith("load knee_skip=0 knee_fresh=0 p99_final_ms=nan ") and "drained_s=-1 " in none
    assert none.endswith(" skip_mix_skipped=nan")


def test_a_lost_request_or_an_undrained_lag_fails_the_run(capsys: pytest.CaptureFixture[str]) -> None:
    steps = {"fresh": [step(1, 1_000)]}
    clean = Accounting(accepted=3, refused=0, lost=0, doubled=0, bad_refusals=0, with_hint=0, served_refused=0)
    assert report(steps, clean, 5.0, 30_000, 10.0) == 0
    assert report(steps, clean, None, 30_000, 10.0) == 1
    lost = Accounting(accepted=3, refused=0, lost=1, doubled=0, bad_refusals=0, with_hint=0, served_refused=0)
    assert report(steps, lost, 5.0, 30_000, 10.0) == 1
    out = capsys.readouterr().out
    assert out.strip().splitlines()[-1].startswith("load knee_skip=0 knee_fresh=1 ")
    assert "fresh: no step missed the bound, so the knee is at least 1/s" in out


# -- prompts ------------------------------------------------------------------------------------------------

def test_the_skip_pool_is_served_safe_families_and_the_fresh_pool_shares_none_of_them() -> None:
    records = [SimpleNamespace(text=f"{family} #{k}", family=family, risk=family.startswith("medical"))
               for family in ("medical/a", "code/b", "code/c", "math/d") for k in range(7)]
    pools = split_pools(records, families=2, seed=1)
    warm_families = {t.split(" #")[0] for t in pools.warmup}
    assert len(warm_families) == 2 and "medical/a" not in warm_families
    assert len(pools.warmup) == 2 * WARMUP_PROMPTS_PER_FAMILY and len(pools.paraphrases) == 2 * 3
    assert {t.split(" #")[0] for t in pools.paraphrases} == warm_families
    assert not set(pools.warmup) & set(pools.paraphrases)
    assert not {t.split(" #")[0] for t in pools.fresh} & warm_families and len(pools.fresh) == 2 * 7
    assert split_pools(records, families=2, seed=1) == pools
    mix = list(itertools.islice(skip_prompts(pools, random.Random(0)), 400))
    repeats = sum(t in pools.warmup for t in mix)
    assert set(mix) <= set(pools.warmup) | set(pools.paraphrases) and 160 < repeats < 240


# -- flags and the stack's processes ------------------------------------------------------------------------

def _args(**overrides: object) -> argparse.Namespace:
    return default_args(load.add_arguments, **overrides)


@pytest.mark.parametrize(("overrides", "named"), [
    ({"rates": ""}, "--rates"),
    ({"rates": "1,x"}, "--rates"),
    ({"rates": "2,0"}, "--rates"),
    ({"step_seconds": 0.0}, "--step-seconds"),
    ({"step_seconds": -5.0}, "--step-seconds"),
    ({"mixes": "skip,stale"}, "--mixes"),
    ({"final_deadline": 10.0}, "--final-deadline"),
    ({"soak": -1.0}, "--soak"),
    ({"workers": 0}, "--workers"),
    ({"shed_wait_s": -1.0}, "--shed-wait-s"),
    ({"shed_min_backlog": 0}, "--shed-min-backlog"),
    ({"backlog_window_s": 0.0}, "--backlog-window-s"),
])
def test_bad_arguments_are_refused_naming_the_flag(overrides: dict, named: str) -> None:
    with pytest.raises(CliError, match=named):
        load.check_arguments(_args(**overrides))


def test_good_arguments_give_the_rates_in_order() -> None:
    assert load.check_arguments(_args(rates="4, 1,2,2")) == Plan([1.0, 2.0, 4.0], ["skip", "fresh"])


def test_a_process_is_read_while_it_runs_and_reads_zero_once_gone() -> None:
    code = ("import sys, threading; files = [open(sys.executable, 'rb') for _ in range(5)]; "
            "threading.Thread(target=sys.stdin.read, daemon=True).start(); sys.stdin.read()")
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        # Each reading is of the live process: its memory, its threads, the five files it opened.
        deadline = time.monotonic() + 30
        while thread_count(child.pid) < 2:
            assert time.monotonic() < deadline, "the child's second thread never started"
            time.sleep(0.01)  # poll interval of a real condition
        assert rss_bytes(child.pid) > 1_000_000
        assert open_fds(child.pid) >= 3 + 5  # stdin, stdout, stderr and the five
    finally:
        child.communicate(timeout=30)  # closing its stdin ends it
    assert cpu_seconds(os.getpid()) > 0
    gone = child.pid
    assert (rss_bytes(gone), cpu_seconds(gone), thread_count(gone), open_fds(gone)) == (0, 0.0, 0, 0)


def test_the_shedding_flags_reach_the_schedulers_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from svc_scheduler.config import SchedulerSettings

    defaults = load.scheduler_env(_args())
    assert defaults == {"STRATA_SHED_BACKLOG_WAIT_S": "10.0", "STRATA_SHED_MIN_BACKLOG": "16",
                        "STRATA_BACKLOG_WINDOW_S": "10.0"}
    # What LiveTiers puts in the scheduler's environment is what the scheduler reads as its settings.
    for name, value in load.scheduler_env(_args(shed_wait_s=2.5, shed_min_backlog=3, backlog_window_s=7.0)).items():
        monkeypatch.setenv(name, value)
    settings = SchedulerSettings()
    assert (settings.shed_backlog_wait_s, settings.shed_min_backlog, settings.backlog_window_s) == (2.5, 3, 7.0)
    assert load.scheduler_env(_args(shed_wait_s=0.0))["STRATA_SHED_BACKLOG_WAIT_S"] == "0.0"  # never shed


class ScriptedLags:
    """A LagReader's reading side, counting its calls: the stack reader must keep reading the one it was given."""

    def __init__(self) -> None:
        self.reads = 0

    def positions(self, groups: list[str]) -> dict:
        from strata.bus.admin import GroupPosition

        self.reads += 1
        assert sorted(groups) == ["bench-r1-l1", "bench-r1-probe"]
        return {("bench-r1-probe", "strata.prompts.level0"): GroupPosition(committed=10, lag=self.reads),
                ("bench-r1-l1", "strata.prompts.level1"): GroupPosition(committed=5, lag=2),
                ("bench-r1-l1", "strata.prompts.level1.retry"): GroupPosition(committed=1, lag=3)}


def test_the_monitor_reads_lag_through_the_one_reader_of_the_run() -> None:
    groups = {"generator-l1": "bench-r1-l1", "probe": "bench-r1-probe"}  # LiveTiers.consumer_groups
    lags = ScriptedLags()
    redis = SimpleNamespace(info=lambda section: {"used_memory": 4096})
    pids = {"self": os.getpid()}  # LiveTiers.pids: the reader sees a restart's new pid
    read = stack_reader(lags, groups, pids, redis)
    first = read()
    pids["self"] = 2**22 + 1  # above Linux's pid_max: a process that does not exist
    second = read()
    assert first.lags == {"generator-l1": 5, "probe": 1} and second.lags["probe"] == 2  # summed over topics
    assert lags.reads == 2 and first.redis_bytes == 4096
    assert first.rss_bytes["self"] > 0 and first.threads["self"] >= 1 and first.fds["self"] >= 3
    assert (second.rss_bytes["self"], second.threads["self"], second.fds["self"]) == (0, 0, 0)


def test_what_a_soak_held_is_the_worst_service_against_its_own_start() -> None:
    start = Sample(0.0, {}, {"a": 100, "b": 200}, 1000, fds={"a": 10, "b": 20}, threads={"a": 4, "b": 8})
    end = Sample(9.0, {}, {"a": 110, "b": 300}, 1500, fds={"a": 12, "b": 21}, threads={"a": 4, "b": 11})
    held = held_figures(start, end, ["a", "b"])
    assert held == HeldFigures(rss_growth=0.5, redis_growth=0.5, threads_added=3, fds_added=2)
    # The restarted service is left out: its new process starts small, and would hide or fake a leak.
    assert held_figures(start, end, ["a"]) == HeldFigures(pytest.approx(0.1), 0.5, 0, 2)
    missing = held_figures(None, end, ["a"])
    assert math.isnan(missing.rss_growth) and missing.threads_added == -1


def test_a_restart_is_only_a_soaks() -> None:
    with pytest.raises(CliError, match="--soak"):
        load.check_arguments(_args(restart="generator-l1"))
    load.check_arguments(_args(restart="generator-l1", soak=60.0))


def test_the_fresh_pool_is_checked_against_the_schedules_the_phases_send() -> None:
    args = _args(rates="2,4,8,16,32", overload_seconds=10.0)
    plan = load.check_arguments(args)

    def pools(n: int) -> Pools:
        return Pools(warmup=["w"], paraphrases=[], fresh=[f"f{i}" for i in range(n)])

    # Every step at seeds 0..4 and the overload at 64/s for 10 s at seed 999 send 1857 fresh prompts; counted
    # with seed 0 throughout they were 1814, and a 1855-prompt split passed the check and ran dry.
    with pytest.raises(CliError, match="need up to 1857 fresh prompts"):
        load._check_fresh_enough(args, plan, pools(1856))
    load._check_fresh_enough(args, plan, pools(1857))
