"""``strata bench generator``: what dynamic batching buys (R15).

Same model, same prompts, one run: (a) sequential ``model.generate`` calls in-process, one prompt at
a time — the baseline; (b) the generator service (gRPC servicer + dynamic batcher, in-process on a
free port) with 16 concurrent clients. Throughput is response tokens per second of wall time.
Its limit, in the same rounds: (c) one plain ``model.generate`` over each round's prompts (batch =
clients), nothing around it. With ``--model DIR`` (any family: Llama, Qwen2, Mistral, GPT-2) the
zoo's model of the tier is measured first in the same run, so the two are read side by side. Last line:
``generator batch_speedup=<(b)/(a)> generator_over_limit=<(c)/(b) tokens/s>`` (of ``--model`` when
given) and ``zoo_batch_speedup=<...>`` when ``--model`` is given.
"""

from __future__ import annotations

import argparse
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from strata import rpc
from strata.rpc import RunningServer, ServiceBinding, start_server
from strata.sampling import Sampling
from strata.v1 import common_pb2, generator_pb2, generator_pb2_grpc
from strata_tools.task.suite import load_suite

if TYPE_CHECKING:  # torch: imported by a run, not by `strata bench --help`
    from svc_generator.backends.hf import HfBackend
    from svc_generator.batcher import DynamicBatcher


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--model", default=None,
                        help="causal LM directory (any family, e.g. `strata models tiny llama DIR`); measured beside "
                             "the zoo's model of the tier in the same run. Default: the zoo's model alone")
    parser.add_argument("--tier", type=int, default=1, choices=(1, 2))
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")


@dataclass(frozen=True)
class Speedup:
    """One model's run: sequential in-process generate against the batching service."""

    label: str
    sequential_tps: float
    service_tps: float
    plain_batched_tps: float  # the limit: one model.generate per round of prompts, nothing around it

    @property
    def ratio(self) -> float:
        return self.service_tps / self.sequential_tps

    @property
    def over_limit(self) -> float:
        """How many times the service's time per token is the plain batched generate's."""
        return self.plain_batched_tps / self.service_tps


def run(args: argparse.Namespace) -> int:
    from strata_tools.zoo.build import ensure_zoo
    from svc_generator.__main__ import model_dir
    from svc_generator.config import GeneratorSettings

    zoo_settings = GeneratorSettings(tier=args.tier, device=args.device, max_batch_size=args.clients,
                                     max_new_tokens=args.max_new_tokens)
    ensure_zoo(zoo_settings)  # a bench may build the zoo; the service never does
    prompts = [r.text for r in load_suite("eval")[: args.prompts]]
    runs = [measure(f"zoo level{args.tier}", model_dir(zoo_settings), zoo_settings, prompts, args)]
    if args.model:
        runs.append(measure(args.model, args.model, zoo_settings.model_copy(update={"model": args.model}), prompts,
                            args))
    for result in runs:
        print(f"{result.label}: batch speedup {result.ratio:.2f}, {result.over_limit:.2f}x the time per token of "
              "plain batched generate")
    line = f"generator batch_speedup={runs[-1].ratio:.2f} generator_over_limit={runs[-1].over_limit:.2f}"
    if args.model:
        line += f" zoo_batch_speedup={runs[0].ratio:.2f}"
    print(line)
    return 0


@dataclass
class _Tally:
    """Tokens generated and wall seconds spent by each side over the rounds, and the service's batches."""

    sequential_tokens: int = 0
    sequential_s: float = 0.0
    service_tokens: int = 0
    service_s: float = 0.0
    plain_tokens: int = 0
    plain_s: float = 0.0
    batches: int = 0


def measure(label: str, path: str, settings: Any, prompts: list[str], args: argparse.Namespace) -> Speedup:
    """(a) sequential in-process generate and (b) the service with concurrent clients, on ``path``."""
    from svc_generator.backends.hf import HfBackend
    from svc_generator.batcher import DynamicBatcher

    backend = HfBackend(path, device=args.device)
    print(f"{label}: {backend.n_params / 1e6:.2f}M params, {backend.prompt_format.kind} prompt format, "
          f"on {backend.device}")
    sampling = Sampling(settings.temperature, settings.top_p, args.max_new_tokens)

    # Both sides run on the same prompts, interleaved in rounds, so that a change in machine load
    # during the run hits both alike. (a) sequential in-process generate, one prompt at a time;
    # (b) the service (gRPC + dynamic batcher) with concurrent clients.
    batcher = DynamicBatcher(backend, settings.max_batch_size, settings.max_wait_ms / 1000)
    stop = threading.Event()
    loop = threading.Thread(target=batcher.run, args=(stop,), daemon=True)
    loop.start()
    server = _start_server(settings, batcher, backend.tokenizer_id, args.clients)
    try:
        tally = _run_rounds(server.port, backend, batcher, prompts, sampling, args)
    finally:
        server.stop(0)
        stop.set()
        loop.join()
    return _report(label, tally, len(prompts), args.clients)


def _start_server(settings: Any, batcher: DynamicBatcher, tokenizer_id: str, clients: int) -> RunningServer:
    """The generator's gRPC servicer over ``batcher``, serving on a free local port."""
    from svc_generator.servicer import GeneratorServicer

    servicer = GeneratorServicer(settings, batcher, None, tokenizer_id)
    return start_server([ServiceBinding(generator_pb2_grpc.add_GeneratorServicer_to_server, servicer,
                                        generator_pb2.DESCRIPTOR.services_by_name["Generator"].full_name)],
                        port=0, settings=settings.model_copy(update={"grpc_max_workers": clients + 4}),
                        host="127.0.0.1")


def _run_rounds(port: int, backend: HfBackend, batcher: DynamicBatcher, prompts: list[str], sampling: Sampling,
                args: argparse.Namespace) -> _Tally:
    """Each round of ``--clients`` prompts through (a) sequential generate, (b) the service, (c) plain batched
    generate, timed in turns; what each side produced and took."""
    from svc_generator.backends.base import GenerationRequest

    tally = _Tally()
    with rpc.channel(f"127.0.0.1:{port}") as channel, ThreadPoolExecutor(max_workers=args.clients) as pool:
        stub = generator_pb2_grpc.GeneratorStub(channel)
        params = common_pb2.SamplingParams(max_new_tokens=args.max_new_tokens)

        def call(prompt: str) -> int:
            reply = stub.Generate(generator_pb2.GenerateRequest(prompt=prompt, sampling=params), timeout=600)
            return sum(g.response_tokens for g in reply.generations)

        backend.generate([GenerationRequest(prompts[0], (), sampling)])  # warm-up, both paths
        call(prompts[0])
        for start in range(0, len(prompts), args.clients):
            chunk = prompts[start : start + args.clients]
            started = time.perf_counter()
            tally.sequential_tokens += sum(len(backend.generate([GenerationRequest(p, (), sampling)])[0].token_ids)
                                           for p in chunk)
            tally.sequential_s += time.perf_counter() - started
            batches_before = batcher.batches
            started = time.perf_counter()
            tally.service_tokens += sum(pool.map(call, chunk))
            tally.service_s += time.perf_counter() - started
            tally.batches += batcher.batches - batches_before
            started = time.perf_counter()
            tally.plain_tokens += plain_batched_generate(backend, chunk, sampling)
            tally.plain_s += time.perf_counter() - started
    return tally


def _report(label: str, tally: _Tally, n_prompts: int, clients: int) -> Speedup:
    """Each side's tokens/s, printed; the model's ``Speedup``."""
    sequential_tps = tally.sequential_tokens / tally.sequential_s
    print(f"  sequential: {n_prompts} prompts, {tally.sequential_tokens} tokens in {tally.sequential_s:.1f} s "
          f"= {sequential_tps:.0f} tokens/s")
    service_tps = tally.service_tokens / tally.service_s
    print(f"  service ({clients} concurrent clients): {tally.service_tokens} tokens in {tally.service_s:.1f} s "
          f"= {service_tps:.0f} tokens/s, {tally.batches} batches "
          f"(mean {n_prompts / max(tally.batches, 1):.1f} per batch)")
    plain_tps = tally.plain_tokens / tally.plain_s
    print(f"  plain batched generate (the limit: {clients} prompts per model.generate): {tally.plain_tokens} tokens "
          f"in {tally.plain_s:.1f} s = {plain_tps:.0f} tokens/s")
    return Speedup(label, sequential_tps, service_tps, plain_tps)


def plain_batched_generate(backend: Any, prompts: list[str], sampling: Any) -> int:
    """One ``model.generate`` over ``prompts`` with the service's sampling, nothing around it: new tokens
    up to each row's stop token (what the service would return)."""
    import torch

    from strata.models.prompts import cut_at_stop

    lm, prompt_format = backend.lm, backend.prompt_format
    batch = prompt_format.encode([prompt_format.generator_text(p) for p in prompts], return_tensors="pt",
                                 padding=True).to(lm.device)
    with torch.no_grad():
        output = lm.model.generate(**batch, max_new_tokens=sampling.max_new_tokens, do_sample=True,
                                   temperature=sampling.temperature, top_p=sampling.top_p, top_k=0,
                                   pad_token_id=lm.tokenizer.pad_token_id, eos_token_id=list(backend.stop_ids))
    stops = set(backend.stop_ids)
    tokens = 0
    for row in output[:, batch["input_ids"].shape[1]:].tolist():
        tokens += len(cut_at_stop(row, stops)[0])
    return tokens
