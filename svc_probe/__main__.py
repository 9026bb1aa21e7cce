"""``python -m svc_probe``: the Level-0 probe service."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Sequence

import torch
from prometheus_client import Counter, Histogram

from strata import redis_client
from strata.bus import Publisher, Worker, topics
from strata.content_store import ContentStore
from strata.contract.models import model_path
from strata.devicetime import device_clock
from strata.models.loading import ZOO_INFO_FILE, LoadedModel, ModelLoadError, check_model_dir, load_causal_lm
from strata.models.probe_head import has_head, load_head, model_hidden_size
from strata.models.prompts import PromptFormat
from strata.rpc import ServiceBinding
from strata.service import ServiceParts, service_main
from strata.v1 import probe_pb2, probe_pb2_grpc
from svc_probe.config import ProbeSettings
from svc_probe.core import ProbeResult, ProbeRules, ProbeSetupError, choose_method, probe
from svc_probe.servicer import ProbeServicer
from svc_probe.worker import ProbeFn, ProbeWorker

PROBE_SECONDS = Histogram("strata_probe_batch_seconds", "Probe forward time per batch (R1 budget: 50 ms/prompt)",
                          buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1))
CAUTIONS = Counter("strata_probe_cautions_total", "Prompts the probe sent to Level-2 (risk or low confidence)")

log = logging.getLogger(__name__)


def make_probe_fn(settings: ProbeSettings) -> tuple[ProbeFn, LoadedModel]:
    """The probe as a function of prompts (thread-safe), and its model.

    Raises ``ProbeSetupError`` (before loading any weights) for a directory the chosen method cannot
    serve, and ``ModelLoadError`` for one that cannot be loaded (a head of another model included).
    """
    path = model_path("probe", settings.model, settings.cache_dir, settings.zoo_preset, "--model (STRATA_MODEL)")
    directory = check_model_dir(path)
    is_zoo_probe = (directory / ZOO_INFO_FILE).is_file()
    method = choose_method(settings.probe_method, has_head(directory), is_zoo_probe, str(directory))
    lm = load_causal_lm(directory, device=settings.device, dtype=settings.dtype)
    head = load_head(directory, model_hidden_size(lm.model)).to(lm.device) if method == "head" else None
    fmt = PromptFormat.of(lm.tokenizer)
    if head is not None:
        log.info("probe method: head (%d directions: %s; %s format)", len(head.names), ",".join(head.names), fmt.kind)
    else:
        log.info("probe method: likelihood of the canonical direction names%s",
                 "" if is_zoo_probe else " (asked for on a model that is not the zoo's probe)")
    rules = ProbeRules.of(settings)
    lock = threading.Lock()  # one forward at a time: gRPC threads and the worker share the model

    def probe_fn(prompts: Sequence[str]) -> list[ProbeResult]:
        with lock, PROBE_SECONDS.time():
            results = probe(lm, prompts, rules, settings.max_prompt_tokens, head=head, fmt=fmt)
        CAUTIONS.inc(sum(r.caution for r in results))
        return results

    return probe_fn, lm


def build(settings: ProbeSettings) -> ServiceParts:
    probe_fn, lm = make_probe_fn(settings)
    client = redis_client.connect(settings.redis_address, socket_timeout=10)
    store = ContentStore(client, settings.content_ttl_s, settings.content_max_bytes)
    publisher = Publisher(settings, client_id="svc-probe")
    handler = ProbeWorker(probe_fn, store, publisher, settings.forward_directions, client, lm.n_params,
                          settings.content_ttl_s, device_clock(lm.device))
    worker = Worker(settings, settings.group_id, publisher=publisher,
                    batch_handlers={topics.PROMPTS_LEVEL0: handler.handle_batch})
    servicer = ProbeServicer(probe_fn, settings.max_prompt_chars, settings.top_k)
    binding = ServiceBinding(probe_pb2_grpc.add_ProbeServicer_to_server, servicer,
                             probe_pb2.DESCRIPTOR.services_by_name["Probe"].full_name)
    return ServiceParts("svc_probe", settings, [binding], settings.grpc_port, workers=[worker],
                        on_stop=[publisher.close, client.close])


def set_torch_threads(settings: ProbeSettings) -> None:
    """The probe process's torch CPU threads (process-wide: the probe is its only model)."""
    if settings.torch_threads is not None:
        torch.set_num_threads(settings.torch_threads)


def build_process(settings: ProbeSettings) -> ServiceParts:
    """``build`` for a process of its own (tests build in-process and keep their own thread count)."""
    set_torch_threads(settings)
    return build(settings)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return service_main(ProbeSettings, build_process, "python -m svc_probe", __doc__, argv)
    except (ProbeSetupError, ModelLoadError) as exc:
        # A configuration mistake (a user's LM without a head, a head of another model, a bad path),
        # not a crash: say what to run or set, without a traceback, exit 2 as service_main does.
        log.error("python -m svc_probe: %s", exc)
        return 2


if __name__ == "__main__":
    sys.exit(main())
