"""``strata submit``: send prompts to the scheduler over gRPC and print decision, tier and final reward.

    strata submit "Explain how binary search works."
    strata submit --file prompts.jsonl --n-samples 4
    strata submit --no-wait "..."          # print the decision and return at once

A prompts file has one JSON object per line with ``prompt`` (or ``text``) and optionally
``n_samples``, ``request_id`` and ``sampling`` ({"temperature": .., "top_p": .., "max_new_tokens": ..});
a line that is a bare JSON string is a prompt. Without ``--no-wait`` the command follows each
accepted prompt with ``Watch`` until its final rewards arrive (one per sample; a skipped prompt's
reused reward is final at once) or ``--timeout`` passes.
"""

from __future__ import annotations

import argparse
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from strata import rpc
from strata.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from strata_tools.cli.main import CliError, read_jsonl

DEFAULT_ADDRESS = os.environ.get("STRATA_SCHEDULER_ADDRESS", "127.0.0.1:50051")
BATCH = 64  # the scheduler's default max_batch_size
_DECISIONS = {common_pb2.DECISION_SKIP: "skip", common_pb2.DECISION_LEVEL_1: "level-1",
              common_pb2.DECISION_LEVEL_2: "level-2"}
_TIERS = {common_pb2.TIER_UNSPECIFIED: "-", common_pb2.TIER_LEVEL_0: "level-0", common_pb2.TIER_LEVEL_1: "level-1",
          common_pb2.TIER_LEVEL_2: "level-2"}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("submit", help="send prompts to the scheduler and print what happens to them")
    parser.add_argument("prompt", nargs="?", help="the prompt text (or use --file)")
    parser.add_argument("--file", type=Path, help="JSON-lines file of prompts")
    parser.add_argument("--address", default=DEFAULT_ADDRESS,
                        help="scheduler gRPC address (env STRATA_SCHEDULER_ADDRESS; default %(default)s)")
    parser.add_argument("--n-samples", type=int, default=0, help="rollouts per prompt (0: the scheduler's default)")
    parser.add_argument("--temperature", type=float, help="sampling temperature (> 0.3, R16)")
    parser.add_argument("--top-p", type=float, help="nucleus sampling top_p (< 0.95, R16)")
    parser.add_argument("--max-new-tokens", type=int, help="longest response")
    parser.add_argument("--no-wait", action="store_true", help="print the decision and return without watching")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for final rewards")
    parser.add_argument("--watch-streams", type=int, default=4,
                        help="prompts watched at once (the scheduler allows 4 Watch streams per client)")
    parser.set_defaults(func=run)


@dataclass
class Tracked:
    response: scheduler_pb2.SubmitResponse
    expected: int  # final rewards to wait for
    rewards: list[float] = field(default_factory=list)


def _sampling(values: dict[str, Any]) -> common_pb2.SamplingParams:
    known = {k: v for k, v in values.items() if v is not None}
    try:
        return common_pb2.SamplingParams(**known)
    except (ValueError, TypeError) as exc:
        raise CliError(f"bad sampling parameters {known}: {exc}") from exc


def _requests(args: argparse.Namespace) -> list[scheduler_pb2.SubmitRequest]:
    defaults = {"temperature": args.temperature, "top_p": args.top_p, "max_new_tokens": args.max_new_tokens}
    if (args.prompt is None) == (args.file is None):
        raise CliError("give either a prompt or --file, not both and not neither")
    if args.prompt is not None:
        return [scheduler_pb2.SubmitRequest(prompt=args.prompt, sampling=_sampling(defaults), n_samples=args.n_samples,
                                            request_id=uuid.uuid4().hex)]
    requests = []
    for number, item in read_jsonl(args.file):
        item = {"prompt": item} if isinstance(item, str) else item
        if not isinstance(item, dict) or not isinstance(item.get("prompt", item.get("text")), str):
            raise CliError(f"{args.file}:{number}: expected a string or an object with a 'prompt' string")
        requests.append(scheduler_pb2.SubmitRequest(
            prompt=item.get("prompt", item.get("text")),
            sampling=_sampling({**defaults, **item.get("sampling", {})}),
            n_samples=int(item.get("n_samples", args.n_samples)),
            request_id=str(item.get("request_id") or uuid.uuid4().hex),
        ))
    if not requests:
        raise CliError(f"{args.file}: no prompts")
    return requests


def _rpc_error(exc: grpc.RpcError, address: str) -> CliError:
    code = exc.code()
    if code == grpc.StatusCode.UNAVAILABLE and "Redis" not in (exc.details() or "") and (
        "Kafka" not in (exc.details() or "")
    ):
        return CliError(f"scheduler at {address} is not reachable ({exc.details()}); is `python -m svc_scheduler` up?")
    return CliError(f"{code.name}: {exc.details()}")


def _watch(stub: scheduler_pb2_grpc.SchedulerStub, tracked: Tracked, deadline: float) -> None:
    """Collect ``tracked``'s final rewards until it has them all or ``deadline`` (monotonic) passes.

    The scheduler caps Watch streams per client: a stream refused with RESOURCE_EXHAUSTED (one just
    closed may not be released yet) is retried after a short pause; its events wait in the hub.
    """
    pause = 0.1
    while len(tracked.rewards) < tracked.expected and (left := deadline - time.monotonic()) > 0:
        stream = stub.Watch(scheduler_pb2.WatchRequest(prompt_hash=tracked.response.prompt_hash), timeout=left)
        try:
            for event in stream:
                if event.WhichOneof("event") == "reward" and event.reward.final:
                    if event.reward.request_id and event.reward.request_id != tracked.response.request_id:
                        continue  # another submission of the same prompt
                    tracked.rewards.append(event.reward.reward)
                    if len(tracked.rewards) >= tracked.expected:
                        break
            return
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                return  # deadline or server gone: reported as "no final reward"
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))  # the cap frees up as streams end
            pause = min(pause * 2, 2.0)
        finally:
            stream.cancel()


def _line(response: scheduler_pb2.SubmitResponse) -> str:
    reused = f" reused_reward={response.reused_reward:.3f}" if response.HasField("reused_reward") else ""
    return (f"{response.prompt_hash[:12]}  decision={_DECISIONS.get(response.decision, '?')} "
            f"tier={_TIERS.get(response.tier, '?')}{reused}  ({response.reason})")


def run(args: argparse.Namespace) -> int:
    if args.watch_streams < 1:
        raise CliError("--watch-streams must be at least 1")
    requests = _requests(args)
    tracked: list[Tracked] = []
    failures = 0
    with rpc.channel(args.address) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        try:
            if len(requests) == 1:
                results = [scheduler_pb2.SubmitBatchResult(response=stub.Submit(requests[0], timeout=60))]
            else:
                results = []
                for start in range(0, len(requests), BATCH):
                    batch = scheduler_pb2.SubmitBatchRequest(requests=requests[start : start + BATCH])
                    results.extend(stub.SubmitBatch(batch, timeout=120).results)
        except grpc.RpcError as exc:
            raise _rpc_error(exc, args.address) from exc
        for request, result in zip(requests, results, strict=True):
            if result.WhichOneof("result") == "error":
                failures += 1
                print(f"refused: {result.error}")
                continue
            response = result.response
            print(_line(response), flush=True)
            skip = response.decision == common_pb2.DECISION_SKIP
            tracked.append(Tracked(response, 1 if skip else max(1, request.n_samples or 1)))
        if args.no_wait or not tracked:
            return 1 if failures else 0
        # A few Watch streams at a time (the scheduler caps them per client); a prompt watched later
        # still gets its events: the scheduler keeps each prompt's recent ones for late watchers.
        deadline = time.monotonic() + args.timeout
        with ThreadPoolExecutor(max_workers=args.watch_streams, thread_name_prefix="watch") as pool:
            list(pool.map(lambda t: _watch(stub, t, deadline), tracked))
    missing = 0
    for t in tracked:
        if t.rewards:
            mean = sum(t.rewards) / len(t.rewards)
            print(f"{t.response.prompt_hash[:12]}  final_reward={mean:.3f} over {len(t.rewards)} reward(s)")
        else:
            missing += 1
            print(f"{t.response.prompt_hash[:12]}  no final reward within {args.timeout:g} s "
                  "(are the probe, generators and reward service running?)")
    return 1 if failures or missing else 0
