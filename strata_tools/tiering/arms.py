"""The live arms: the real services (probe, generators, reward, scheduler) each in its own process, and
an arm's prompts through one route with what the cost ledger booked for them."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strata import ledger, redis_client, rpc
from strata.bus import Publisher, Topic, topics
from strata.bus.admin import start_group_at_end
from strata.bus.tail import TailReader
from strata.content_store import ContentStore
from strata.v1 import common_pb2, events_pb2, scheduler_pb2, scheduler_pb2_grpc
from strata_tools.infra.process import free_port
from strata_tools.stack.control import health
from strata_tools.task.desk import SimulatedDesk
from strata_tools.task.oracle import SimulatedAnnotator
from strata_tools.train import Request, request_done

log = logging.getLogger(__name__)

# A service's module (``python -m``), its arguments and the environment of its own.
_ServiceSpec = tuple[str, list[str], dict[str, str]]


@dataclass
class ArmRun:
    name: str
    requests: list[Request]
    stages: list[ledger.StageCost]    # what the arm booked, from the aggregates
    wall_s: float


class ArmRunner:
    """Pushes one arm's prompts through a running stack and waits for every final reward: by Kafka straight
    to a tier (``level2``: Level-2 generation and the strong RM; ``level0``: probe, Level-1, light RM and
    escalation) or through the scheduler's ``SubmitBatch`` (``scheduler``: skipping included). Each
    request's cost is what the stack booked for it in the ledger."""

    def __init__(self, settings: Any, run_id: str, seed: int, scheduler_address: str = "") -> None:
        self.settings, self.run_id, self.seed = settings, run_id, seed
        self.scheduler_address = scheduler_address

    def run_arm(self, name: str, records: Sequence[Any], route: str, timeout_s: float,
                progress: Callable[[str], None], n_samples: int = 1, tag: str = "", first_index: int = 0) -> ArmRun:
        """Send ``records`` through one arm (route: level2 | level0 | scheduler) and wait for every final;
        ``n_samples`` rollouts per prompt. Prompt ``i`` is sampled with the seed of position ``first_index + i``,
        so an arm run in parts samples as it would whole, paired with the other arms prompt by prompt."""
        s = self.settings
        client = redis_client.connect(s.redis_address, socket_timeout=30)
        store = ContentStore(client, s.content_ttl_s, s.content_max_bytes)
        tail = TailReader(s, [topics.REWARDS_SCORED], client_id=f"bench-tiers-{self.run_id}")
        tail.seek_to_end()
        tag = tag or f"{self.run_id}-{name.replace(' ', '').replace('+', '-')}"
        requests = [Request(r, f"{tag}-{i}") for i, r in enumerate(records)]
        n = n_samples
        before = ledger.read_stages(client)
        started = time.monotonic()
        try:
            if route == "scheduler":
                self._submit(requests, n, first_index)
            else:
                self._publish(requests, route, store, n, first_index)
            refused = [r for r in requests if r.decision == "refused"]
            if refused:
                raise RuntimeError(f"{name}: the scheduler refused {len(refused)} prompts (see the log)")
            by_id = {r.request_id: r for r in requests}
            self._wait(tail, by_id, started + timeout_s, name, progress, n)
        finally:
            tail.close()
        wall = time.monotonic() - started
        # The aggregates move when a batch's transaction commits, which is after its events are acked.
        stages = self._settled_stages(client, before, requests)
        client.close()
        return ArmRun(name, requests, stages, wall)

    def _settled_stages(self, client: Any, before: list[ledger.StageCost], requests: Sequence[Request]
                        ) -> list[ledger.StageCost]:
        """The arm's stages once every scored sample's RM cost is booked (the reward worker books a
        batch in the transaction that marks it done, just after its events are acknowledged)."""
        # One RM score per answer: an answer awaiting the desk gets a provisional event and a final one.
        rm_scorers = (common_pb2.SCORER_LIGHT, common_pb2.SCORER_STRONG)
        scored = len({(r.request_id, e.tier, e.sample_index) for r in requests for e in r.events
                      if e.scorer in rm_scorers})
        deadline = time.monotonic() + 60
        while True:
            booked = sum(s.items for r in requests
                         for s in ledger.read_request(client, r.prompt_hash, r.request_id)
                         if s.stage in ("rm_light", "rm_strong"))
            if booked >= scored:
                return ledger.subtract(ledger.read_stages(client), before)
            if time.monotonic() > deadline:
                raise TimeoutError(f"{booked} of {scored} scored samples booked in the ledger after 60 s")
            time.sleep(0.2)

    def _publish(self, requests: Sequence[Request], route: str, store: Any, n_samples: int = 1,
                 first_index: int = 0) -> None:
        level2 = route == "level2"
        publisher = Publisher(self.settings, client_id=f"bench-tiers-{self.run_id}")
        try:
            futures = []
            for i, request in enumerate(requests):
                request.prompt_hash = store.put(request.record.text)
                routed = events_pb2.PromptRouted(
                    prompt_hash=request.prompt_hash, n_samples=n_samples, request_id=request.request_id,
                    tier=common_pb2.TIER_LEVEL_2 if level2 else common_pb2.TIER_LEVEL_0,
                    decision=common_pb2.DECISION_LEVEL_2 if level2 else common_pb2.DECISION_LEVEL_1,
                    reason="bench tiers: all-Level-2 arm" if level2 else "bench tiers: tiered arm",
                    sampling=common_pb2.SamplingParams(seed=self.seed * 100_003 + first_index + i),
                )
                routed.submitted_at.GetCurrentTime()
                routed.routed_at.GetCurrentTime()
                topic = topics.PROMPTS_LEVEL2 if level2 else topics.PROMPTS_LEVEL0
                futures.append(publisher.publish(topic, routed))
            publisher.wait(futures)
        finally:
            publisher.close()

    def _submit(self, requests: Sequence[Request], n_samples: int = 1, first_index: int = 0) -> None:
        batch_size = 32  # under the scheduler's max_batch_size (64)
        with rpc.channel(self.scheduler_address) as channel:
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            for start in range(0, len(requests), batch_size):
                chunk = requests[start:start + batch_size]
                reply = stub.SubmitBatch(scheduler_pb2.SubmitBatchRequest(requests=[
                    scheduler_pb2.SubmitRequest(
                        prompt=r.record.text, n_samples=n_samples, request_id=r.request_id,
                        sampling=common_pb2.SamplingParams(seed=self.seed * 100_003 + first_index + start + j))
                    for j, r in enumerate(chunk)
                ]), timeout=300)
                for request, result in zip(chunk, reply.results, strict=True):
                    if result.WhichOneof("result") != "response":
                        request.decision, request.reason = "refused", result.error
                        log.warning("prompt refused by the scheduler: %s", result.error)
                        continue
                    request.prompt_hash = result.response.prompt_hash
                    request.decision = common_pb2.Decision.Name(result.response.decision)
                    request.reason = result.response.reason

    @staticmethod
    def _wait(tail: Any, by_id: dict[str, Request], deadline: float, name: str,
              progress: Callable[[str], None], n_samples: int = 1) -> None:
        last = 0.0
        while True:
            pending = [r for r in by_id.values() if not request_done(r.events, n_samples)]
            if not pending:
                return
            now = time.monotonic()
            if now > deadline:
                raise TimeoutError(f"{name}: {len(pending)} of {len(by_id)} prompts have no final reward "
                                   f"after the arm's timeout (first: request {pending[0].request_id})")
            if now - last > 15:
                progress(f"      {name}: {len(by_id) - len(pending)}/{len(by_id)} prompts final")
                last = now
            for _topic, event in tail.poll(0.5):
                request = by_id.get(event.request_id)
                if request is not None:
                    request.events.append(event)


# The services whose consumer groups are the rollout tiers (the scheduler's backlog_groups).
TIER_GROUPS = ("probe", "generator-l1", "generator-l2", "reward")


class LiveTiers(ArmRunner):
    """The services, each in its own process, and the means to push an arm through them."""

    def __init__(self, settings: Any, zoo: Any, run_id: str, review_seconds: float, seed: int,
                 scheduler_env: dict[str, str] | None = None, learner_args: Sequence[str] | None = None,
                 reward_env: dict[str, str] | None = None,
                 desk: Sequence[SimulatedAnnotator] | None = None) -> None:
        """``learner_args``: also run the learner (those svc_learner flags), training the zoo's policy on the
        rewards and publishing each version to the Level-1 generator: a moving policy. None: a fixed one.
        ``scheduler_env``, ``reward_env``: settings of those services (``STRATA_*``) over the bench's own.
        ``desk``: also run svc_annotation with these simulated annotators scoring what the reward service
        sends it (their Level-1 scores feed the scheduler's record); None: no desk, as before."""
        super().__init__(settings, run_id, seed)
        self.zoo = zoo
        self.review_seconds = review_seconds
        self.scheduler_env = scheduler_env or {}
        self.reward_env = reward_env or {}
        self.learner_args = None if learner_args is None else list(learner_args)
        self.desk_annotators = None if desk is None else list(desk)
        self.desk: SimulatedDesk | None = None
        self.checkpoint_dir = Path(settings.state_dir) / "bench" / run_id / "checkpoints"
        # While started, by service name: gRPC port, process id and consumer group (what benches watch).
        self.ports: dict[str, int] = {}
        self.pids: dict[str, int] = {}
        self.consumer_groups: dict[str, str] = {}
        self._specs: dict[str, _ServiceSpec] = {}
        self._processes: dict[str, subprocess.Popen] = {}
        self._logs = Path(settings.state_dir) / "logs"
        # A restart (from another thread: a soak's timer) and the stop never interleave: no process is
        # started after the stop took its list.
        self._process_lock = threading.Lock()
        self._stopping = False

    @contextmanager
    def started(self) -> Iterator[LiveTiers]:
        """Each service in its own process, as deployed: on a shared CPU, device-seconds are each
        process's CPU seconds (``strata.devicetime``), which one process per service keeps apart."""
        groups = self._consumer_groups()
        self.consumer_groups = {name: group for name, (group, _) in groups.items()}
        self._specs = self._service_specs(groups)
        self._logs.mkdir(parents=True, exist_ok=True)
        self.ports, self._processes, self._stopping = {}, {}, False
        try:
            self._spawn(self._specs, self._logs, self._processes)
            self._await_healthy(self._processes, self.ports, self._logs)
            self.pids = {name: process.pid for name, process in self._processes.items()}
            self.scheduler_address = f"127.0.0.1:{self.ports['scheduler']}"
            if self.desk_annotators is not None:
                self.desk = SimulatedDesk(f"127.0.0.1:{self.ports['annotation']}", self.desk_annotators,
                                          settings=self.settings).start()
            yield self
        finally:
            if self.desk is not None:
                self.desk.stop()
            with self._process_lock:
                self._stopping = True
            self._stop_processes(self._processes)
            self.pids = {}

    def restart(self, name: str) -> float:
        """Kill service ``name`` (SIGKILL: a crash, nothing flushed) and start it again on its port, with its
        group and settings; return the seconds until it answered its health check again. Its uncommitted
        events are redelivered to the new process (at-least-once; handlers are idempotent by hash)."""
        if name not in self._processes:
            raise KeyError(f"no service {name!r} running; running: {', '.join(self._processes)}")
        started = time.monotonic()
        with self._process_lock:
            if self._stopping:
                raise RuntimeError(f"not restarting {name}: the services are stopping")
            old = self._processes[name]
            old.kill()
            old.wait(timeout=30)
            # The crash and the restart in one log.
            self._processes[name] = self._popen(name, self._specs[name], self._logs / f"{name}.log", "ab")
            self.pids[name] = self._processes[name].pid  # read from now on, while it loads
        self._await_healthy(self._processes, {name: self.ports[name]}, self._logs)
        return time.monotonic() - started

    def _common_env(self) -> dict[str, str]:
        """The environment every service gets: this run's Kafka, Redis and state dir, on the CPU."""
        s = self.settings
        # One intra-op thread per service: an idle OpenMP thread spins on a shared CPU, and its spinning
        # would count as the service's CPU seconds (measured: Level-1 at 24.7 ms/token with 2 threads).
        return {"STRATA_KAFKA_BOOTSTRAP": s.kafka_address, "STRATA_REDIS_URL": s.redis_address,
                "STRATA_STATE_DIR": str(s.state_dir), "STRATA_DEVICE": "cpu", "STRATA_LOG_LEVEL": "WARNING",
                "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

    def _consumer_groups(self) -> dict[str, tuple[str, list[Topic[Any]]]]:
        """Each service's consumer group and the topics it reads, every group started at the topics' end."""
        # Consumer groups of this run only, started at the end of their topics: what an earlier run (or
        # another bench on the same Kafka) left there is never rolled out or folded in again.
        groups: dict[str, tuple[str, list[Topic[Any]]]] = {
            "probe": (f"bench-{self.run_id}-probe", [topics.PROMPTS_LEVEL0]),
            "generator-l1": (f"bench-{self.run_id}-l1", [topics.PROMPTS_LEVEL1]),
            "generator-l2": (f"bench-{self.run_id}-l2", [topics.PROMPTS_LEVEL2]),
            "reward": (f"bench-{self.run_id}-reward", [topics.ROLLOUTS_GENERATED]),
            "scheduler": (f"bench-{self.run_id}-stats",
                          [topics.REWARDS_SCORED, topics.POLICY_UPDATED, topics.RM_UPDATED,
                           topics.ANNOTATIONS_COMPLETED]),
        }
        if self.learner_args is not None:
            groups["learner"] = (f"bench-{self.run_id}-learner", [topics.REWARDS_SCORED])
        if self.desk_annotators is not None:
            groups["annotation"] = (f"bench-{self.run_id}-annotation", [topics.ANNOTATIONS_REQUESTED])
        for group, topic_list in groups.values():
            start_group_at_end(self.settings, group, topic_list)
        return groups

    def _service_specs(self, groups: dict[str, tuple[str, list[Topic[Any]]]]) -> dict[str, _ServiceSpec]:
        """Each service's module, arguments and environment of its own, by name."""
        zoo = self.zoo
        # Policy versions are checked against the learner's checkpoint directory (docs/reliability.md).
        follow = {"STRATA_POLICY_CHECKPOINT_ROOT": str(self.checkpoint_dir)}
        desk: dict[str, _ServiceSpec] = {} if self.desk_annotators is None else {
            "annotation": ("svc_annotation", [], {"STRATA_GROUP_ID": groups["annotation"][0], "STRATA_WEB_PORT": "0"})}
        learner: dict[str, _ServiceSpec] = {} if self.learner_args is None else {
            "learner": ("svc_learner", self.learner_args, {
                "STRATA_GROUP_ID": groups["learner"][0], "STRATA_POLICY_MODEL_PATH": str(zoo.policy),
                "STRATA_CHECKPOINT_DIR": str(self.checkpoint_dir)})}
        return {
            "probe": ("svc_probe", ["--model", str(zoo.probe)], {"STRATA_GROUP_ID": groups["probe"][0]}),
            "generator-l1": ("svc_generator", ["--tier", "1", "--model", str(zoo.level1)],
                             {"STRATA_GROUP_ID": groups["generator-l1"][0], **follow}),
            "generator-l2": ("svc_generator", ["--tier", "2", "--model", str(zoo.level2)],
                             {"STRATA_GROUP_ID": groups["generator-l2"][0]}),
            "reward": ("svc_reward", ["--light-rm", str(zoo.light_rm), "--strong-rm", str(zoo.strong_rm)],
                       # The replay compares raw light-RM scores with the threshold, so the live router must
                       # too; and no desk runs here to await.
                       {"STRATA_RM_WATCH": "false", "STRATA_USE_CALIBRATION": "false",
                        "STRATA_AWAIT_ANNOTATION": "false", "STRATA_REVIEW_SECONDS_PER_ITEM": str(self.review_seconds),
                        "STRATA_GROUP_ID": groups["reward"][0], **self.reward_env}),
            "scheduler": ("svc_scheduler", [], {
                "STRATA_REDIS_PREFIX": f"strata:bench:{self.run_id}",
                "STRATA_STATS_GROUP_ID": groups["scheduler"][0], "STRATA_WATCH_LOOKBACK_S": "0",
                # The door sheds on this run's tiers' backlog, not on groups of the default names.
                "STRATA_BACKLOG_GROUPS": ",".join(groups[tier][0] for tier in TIER_GROUPS),
                **follow, **self.scheduler_env}),
            **learner,
            **desk,
        }

    def _spawn(self, specs: dict[str, _ServiceSpec], logs: Path,
               processes: dict[str, subprocess.Popen]) -> None:
        """Start each service on a free gRPC port, logging to ``logs``. Each goes into ``processes`` as it
        starts, so that the caller's ``finally`` stops those running when a later one fails to start."""
        for name, spec in specs.items():
            self.ports[name] = free_port(avoid=set(self.ports.values()))
            processes[name] = self._popen(name, spec, logs / f"{name}.log", "wb")

    def _popen(self, name: str, spec: _ServiceSpec, log: Path, mode: str) -> subprocess.Popen:
        """Service ``name`` as a process on its port, writing to ``log`` (``mode`` "ab": after a crash's)."""
        module, argv, env = spec
        with open(log, mode) as out:
            return subprocess.Popen([sys.executable, "-m", module, "--grpc-port", str(self.ports[name]), *argv],
                                    env={**os.environ, **self._common_env(), **env}, stdout=out,
                                    stderr=subprocess.STDOUT)

    @staticmethod
    def _await_healthy(processes: dict[str, subprocess.Popen], ports: dict[str, int], logs: Path) -> None:
        """Return once every service answers its health check; raise if one exits or 300 s pass."""
        deadline = time.monotonic() + 300
        pending = dict(ports)
        while pending:
            for name, port in list(pending.items()):
                if processes[name].poll() is not None:
                    raise RuntimeError(f"{name} exited with {processes[name].returncode}; see {logs / name}.log")
                if health(port):
                    del pending[name]
            if pending and time.monotonic() > deadline:
                raise RuntimeError(f"not healthy after 300 s: {', '.join(pending)}; see the logs in {logs}")
            time.sleep(0.5)

    @staticmethod
    def _stop_processes(processes: dict[str, subprocess.Popen]) -> None:
        """Terminate every process, then kill those still running after 30 s."""
        for process in processes.values():
            process.terminate()
        for process in processes.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()

