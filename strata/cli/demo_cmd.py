"""``strata demo``: what `make demo` runs.

At this stage of the project it brings up the local Kafka and Redis, stores a prompt in the content
store, publishes it to the Level-0 topic and reads it back through a consumer-group worker, printing
each step. The full loop (tiers, rewards, PPO, report) replaces this as the services land.
"""

from __future__ import annotations

import argparse
import threading
import time
import uuid

from strata.bus import Delivery, Publisher, Worker, topics
from strata.cli.main import CliError
from strata.config import StrataSettings
from strata.content_store import ContentStore
from strata.infra import InfraError, up
from strata.v1 import common_pb2, events_pb2


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("demo", help="bring up the stack and push a prompt through it")
    parser.add_argument("--prompt", default="Explain the principle of backpropagation in two sentences.")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the event")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = StrataSettings()
    print("1/4 starting Kafka and Redis (strata infra up) ...", flush=True)
    try:
        rows = up(settings)
    except InfraError as exc:
        raise CliError(str(exc)) from exc
    for row in rows:
        print(f"    {row.name:<6} {row.state:<4} {row.address}")

    store = ContentStore.from_url(settings.redis_address, settings.content_ttl_s, settings.content_max_bytes)
    prompt_hash = store.put(args.prompt)
    print(f"2/4 stored the prompt in the content store: sha256 {prompt_hash[:16]}...")

    event = events_pb2.PromptRouted(
        prompt_hash=prompt_hash, tier=common_pb2.TIER_LEVEL_0, decision=common_pb2.DECISION_LEVEL_1,
        reason="demo", n_samples=1, request_id=uuid.uuid4().hex,
    )
    event.submitted_at.GetCurrentTime()
    event.routed_at.GetCurrentTime()
    publisher = Publisher(settings.kafka_address, client_id="strata-demo")
    sent_at = time.perf_counter()
    publisher.publish_and_wait(topics.PROMPTS_LEVEL0, event)
    print(f"3/4 published PromptRouted to {topics.PROMPTS_LEVEL0.name} (acks=all)")

    received: list[Delivery] = []
    stop = threading.Event()

    def handle(delivery: Delivery) -> None:
        if delivery.message.request_id == event.request_id:
            received.append(delivery)
            stop.set()

    # A one-off group reads the topic from the beginning; stop after our event or the timeout.
    worker = Worker(settings, f"strata-demo-{event.request_id[:8]}", {topics.PROMPTS_LEVEL0: handle}, publisher)
    timer = threading.Timer(args.timeout, stop.set)
    timer.start()
    try:
        worker.run(stop)
    finally:
        timer.cancel()
        publisher.close()
    if not received:
        raise CliError(f"the event did not come back within {args.timeout:.0f} s; see .strata/kafka/logs")
    text = store.get_text(received[0].message.prompt_hash)
    print(f"4/4 consumed it back in {time.perf_counter() - sent_at:.2f} s "
          f"(partition {received[0].partition}, offset {received[0].offset}); "
          f"content store returns the prompt: {text == args.prompt}")
    print("Kafka and Redis stay up; stop them with `.venv/bin/strata infra down`.")
    return 0
