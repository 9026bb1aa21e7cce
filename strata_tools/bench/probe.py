"""``strata bench probe``: latency of the Level-0 probe per prompt through its gRPC API (R1: < 50 ms).

Measured in one run on this machine: the probe service in-process on a free port (with the torch
threads the service process sets, ``torch_threads``), one client calling ``Directions`` for each eval
prompt after a warm-up. Its limit, in the same run and on the same prompts: the model forward alone
that the probe runs for one prompt, inputs prepared (``svc_probe.core.forward_alone``); the rest is
tokenizing, reading the scores, rules and gRPC. Also reports how often the top direction is the
prompt's intent and how many risk prompts were flagged cautious.
Last line: ``probe p99_ms=<n> forward_p99_ms=<n> probe_over_limit=<p99 / forward p99>``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from strata import rpc
from strata.rpc import ServiceBinding, start_server
from strata.v1 import probe_pb2, probe_pb2_grpc
from strata_tools.task.suite import load_suite


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompts", type=int, default=200, help="eval prompts to time")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--model", default=None, help="probe directory (default: the zoo's probe)")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def run(args: argparse.Namespace) -> int:
    from strata.models.probe_head import has_head, load_head, model_hidden_size
    from strata.models.prompts import PromptFormat
    from strata_tools.zoo.build import ensure_zoo
    from svc_probe.__main__ import make_probe_fn, set_torch_threads
    from svc_probe.config import ProbeSettings
    from svc_probe.core import forward_alone
    from svc_probe.servicer import ProbeServicer

    settings = ProbeSettings(model=args.model, device="cpu")
    if not settings.model:
        ensure_zoo(settings)  # a bench may build the zoo; the service never does
    set_torch_threads(settings)  # as the service's own process does
    probe_fn, lm = make_probe_fn(settings)
    head = load_head(lm.path, model_hidden_size(lm.model)) if has_head(lm.path) else None
    server = start_server([ServiceBinding(probe_pb2_grpc.add_ProbeServicer_to_server,
                                          ProbeServicer(probe_fn, settings.max_prompt_chars, settings.top_k),
                                          probe_pb2.DESCRIPTOR.services_by_name["Probe"].full_name)],
                          port=0, host="127.0.0.1")
    everything = load_suite("eval")
    records = everything[:: max(1, len(everything) // args.prompts)][: args.prompts]  # spread over topics
    latencies_ms: list[float] = []
    forward_ms: list[float] = []
    top1 = cautious_risk = risk_total = cautious_safe = 0
    try:
        with rpc.channel(f"127.0.0.1:{server.port}") as channel:
            stub = probe_pb2_grpc.ProbeStub(channel)
            for record in records[: args.warmup]:
                stub.Directions(probe_pb2.DirectionsRequest(prompt=record.text), timeout=30)
            for record in records:  # the forward alone and the whole call, in turns
                forward = forward_alone(lm, [record.text], settings.max_prompt_tokens, head,
                                        PromptFormat.of(lm.tokenizer))
                started = time.perf_counter()
                forward()
                forward_ms.append(1000 * (time.perf_counter() - started))
                started = time.perf_counter()
                reply = stub.Directions(probe_pb2.DirectionsRequest(prompt=record.text), timeout=30)
                latencies_ms.append(1000 * (time.perf_counter() - started))
                top1 += reply.directions[0].name == record.intent
                if record.risk:
                    risk_total += 1
                    cautious_risk += reply.caution
                else:
                    cautious_safe += reply.caution
    finally:
        server.stop(0)
    n = len(records)
    print(f"prompts={n} top1_direction_accuracy={top1 / n:.3f} "
          f"risk_flagged={cautious_risk}/{risk_total} safe_flagged={cautious_safe}/{n - risk_total}")
    print(f"method={'head' if head is not None else 'likelihood'} torch_threads={torch.get_num_threads()}")
    print(f"latency ms: mean={statistics.mean(latencies_ms):.2f} p50={percentile(latencies_ms, 50):.2f} "
          f"p99={percentile(latencies_ms, 99):.2f} (budget 50 ms, R1)")
    print(f"forward alone ms: p50={percentile(forward_ms, 50):.2f} p99={percentile(forward_ms, 99):.2f}")
    p99, limit = percentile(latencies_ms, 99), percentile(forward_ms, 99)
    print(f"probe p99_ms={p99:.2f} forward_p99_ms={limit:.2f} probe_over_limit={p99 / limit:.2f}")
    return 0
