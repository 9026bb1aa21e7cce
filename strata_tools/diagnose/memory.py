"""Rollout memory growth (seed §5.1 row 4): does a generator keep memory across rollouts?

Symptom: out-of-memory during the rollout phase. Check: watch ``torch.cuda.memory_allocated()``
before and after rollouts; a jump that stays means the attention (KV) cache is not released. Cure:
at the end of the rollout loop ``del outputs; torch.cuda.empty_cache()`` (the generator's batcher
calls ``backend.release_memory()`` after every batch).

The generator's memory is read from its Prometheus endpoint: ``strata_device_memory_allocated_bytes``
(CUDA, exported by ``strata.rpc_metrics.DeviceMemoryCollector``) when present, else ``process_resident_memory_bytes``
(RSS, exported by prometheus_client on Linux). After warm-up rounds (first batches allocate caches
and kernels once), a baseline is read, then one reading after each rollout round; the least-squares
slope in bytes per round is the number. A one-off jump barely moves the slope; a leak moves it by the
leaked size per round.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from strata.rpc_metrics import DEVICE_METRIC
from strata_tools.diagnose.verdict import CheckResult, Verdict

NAME = "memory"
CURE = ("release the rollout's memory at the end of every batch: `del outputs; torch.cuda.empty_cache()` "
        "(a Strata backend does it in release_memory); look for references kept to outputs or KV caches")
MIB = 1 << 20
RSS_METRIC = "process_resident_memory_bytes"


@dataclass(frozen=True)
class MemoryConfig:
    rounds: int = 5                                  # measured rollout rounds after the warm-up
    warmup_rounds: int = 1                           # rounds before the baseline reading
    samples_per_round: int = 8                       # responses generated per round (one Generate call)
    max_growth_per_round_bytes: float = 16 * MIB     # slope above which the check alarms


@dataclass(frozen=True)
class MemoryReading:
    bytes: float
    source: str          # e.g. "CUDA allocated" or "process RSS"


def slope(values: Sequence[float]) -> float:
    """Least-squares slope of ``values`` against 0, 1, 2, ...: growth per step."""
    n = len(values)
    if n < 2:
        raise ValueError("need at least 2 readings")
    mx, my = (n - 1) / 2, sum(values) / n
    return sum((i - mx) * (v - my) for i, v in enumerate(values)) / sum((i - mx) ** 2 for i in range(n))


def reading_from_metrics(text: str) -> MemoryReading:
    """The generator's memory from its ``/metrics`` text: CUDA allocated if exported, else RSS."""
    device: float | None = None
    rss: float | None = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == DEVICE_METRIC:
                device = (device or 0.0) + sample.value
            elif sample.name == RSS_METRIC:
                rss = sample.value
    if device is not None:
        return MemoryReading(device, "CUDA allocated")
    if rss is not None:
        return MemoryReading(rss, "process RSS")
    raise ValueError(f"the metrics carry neither {DEVICE_METRIC} nor {RSS_METRIC}")


def local_reading() -> MemoryReading:
    """This process's memory: CUDA allocated when CUDA is in use here, else RSS from /proc."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return MemoryReading(float(sum(torch.cuda.memory_allocated(i) for i in range(torch.cuda.device_count()))),
                             "CUDA allocated")
    with open("/proc/self/statm") as handle:
        return MemoryReading(float(int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")), "process RSS")


@dataclass(frozen=True)
class MemoryMeasurement:
    readings: list[float]      # baseline, then one per round (bytes)
    source: str
    samples_per_round: int

    @property
    def growth_per_round(self) -> float:
        return slope(self.readings)


def measure(rollout: Callable[[], None], read: Callable[[], MemoryReading], config: MemoryConfig
            ) -> MemoryMeasurement:
    """Warm up, read the baseline, then alternate one rollout round and one reading."""
    for _ in range(config.warmup_rounds):
        rollout()
    first = read()
    readings = [first.bytes]
    for _ in range(config.rounds):
        rollout()
        readings.append(read().bytes)
    return MemoryMeasurement(readings, first.source, config.samples_per_round)


def evaluate(m: MemoryMeasurement, config: MemoryConfig) -> CheckResult:
    growth = m.growth_per_round
    summary = (f"{m.source} {m.readings[0] / MIB:.1f} -> {m.readings[-1] / MIB:.1f} MiB over {len(m.readings) - 1} "
               f"rollout rounds of {m.samples_per_round} samples: {growth / MIB:+.1f} MiB per round")
    verdict = Verdict.ALARM if growth > config.max_growth_per_round_bytes else Verdict.PASS
    details = {"source": m.source, "readings_mib": [round(r / MIB, 2) for r in m.readings],
               "growth_mib_per_round": growth / MIB}
    return CheckResult(NAME, verdict, growth / MIB, config.max_growth_per_round_bytes / MIB,
                       f"growth > {config.max_growth_per_round_bytes / MIB:g} MiB/round alarms", summary, CURE, details)
