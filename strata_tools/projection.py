"""Seconds per PPO update at a deployment's sizes, on paper, with and without overlap (issue 63, item 5).

A bench run measures one update's work in units no model size changes: the tokens each model generated
or read (the ledger), and the seconds of the critical path that are Strata's own plumbing (the trace's
``driver``, ``scheduler+probe`` and ``batching`` stages: the request's way in, the routing decision,
Kafka hops and the learner filling its batch). This module prices that work on GPUs at the sizes
``--price-as`` names, from published throughput (``GPUS``, sources in docs/performance.md):

- generation: output tokens at a published batched-decode rate (vLLM), scaled inversely with the model's
  parameters (decode reads every weight once per step: memory-bound), plus the prompt's prefill;
- a forward pass (encoder, probe, either RM): ``2 x params x tokens`` FLOPs at ``forward_mfu`` of peak;
- the learner: ``(6 x update_epochs + 4) x params x tokens`` FLOPs on the trained tiers' tokens (forward
  and backward per epoch; the old policy's and the reference's forward, ``svc_learner.ppo.ppo_update``) at
  ``train_mfu`` of peak, plus Level-2's forward over its own rows (R13's behaviour log-probs);
- the weight sync: the policy's bf16 weights through ``sync_bytes_per_s`` (today a checkpoint written by
  the learner and read by each generator).

Each service runs on its own GPU, as deployed. **Sequential**: the generators wait for the weights, so an
update is the rollout (the busiest rollout GPU, plus the plumbing on the way to it) followed by the
learner (filling its batch, training, sync). **Overlapped** (R15, the default): the rollout of version
v+1 runs while the learner trains on v, so an update is the slower of the two, and the plumbing costs
only what the other side does not hide. The plumbing is held at what this machine measured on a CPU: an
upper bound, since on a GPU deployment the encoder and probe run on devices.

A projection, labelled so: it holds the measured decisions and tokens fixed and says nothing of how a
larger model's answers would change them. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from strata.ledger import StageCost
from strata_tools.pricing import ROLE_OF, PriceAs

# The trace's stages that no model size changes (strata_tools.trace.STAGES), Strata's plumbing: on the way
# to the generators, and the learner's filling its batch.
ROLLOUT_PLUMBING = ("driver", "scheduler+probe")
LEARNER_PLUMBING = ("batching",)
ROLLOUT_ROLES = ("scheduler", "encoder", "probe", "level1", "level2", "rm")
# svc_reward serves both RMs from one device: their seconds add up on it.
# Processes that decide for every prompt on no model device of their own (their CPU seconds, measured).
CONTROL_PROCESSES = ("scheduler",)
DEVICE_OF = {"encoder": "encoder", "probe": "probe", "level1": "level1", "level2": "level2",
             "rm_light": "rm", "rm_strong": "rm"}
# Where the plumbing's share of an update stops mattering.
NEGLIGIBLE_SHARE = 0.05
SIZE_FACTORS = tuple(2.0**k for k in range(-6, 7))  # the sizes tried: 1/64 to 64 times those named
# A deployment's batch: OpenRLHF's benchmark shape, 1024 prompts a rollout with up to 1024 prompt and 1024
# answer tokens each (its README's PPO table).
DEPLOYMENT_SAMPLES, DEPLOYMENT_SAMPLE_TOKENS = 1024, 2048


@dataclass(frozen=True)
class Gpu:
    name: str
    bf16_flops: float  # dense peak
    decode_tokens_per_s: float  # one GPU's batched decode, output tokens per second, of a model of:
    decode_ref_params: float
    source: str


# Sources in docs/performance.md (*At a deployment's sizes, on paper*): peak bf16 from NVIDIA's datasheets;
# decode from vLLM 0.6.0's offline ShareGPT run of Llama-3.1-8B on one A100-80GB (4 132 output tokens/s),
# and for the H100 that figure times the HBM bandwidth ratio (3.35 / 2.0 TB/s; TensorRT-LLM's FP8 7B: 6 818).
GPUS: Mapping[str, Gpu] = {
    "a100": Gpu("A100-80GB", 312e12, 4132.0, 8.0e9, "vLLM 0.6.0 offline, Llama-3.1-8B: 4 132 output tokens/s"),
    "h100": Gpu("H100-SXM", 989e12, 6920.0, 8.0e9, "the A100's vLLM figure x the HBM bandwidth ratio: 6 920 tokens/s"),
}


@dataclass(frozen=True)
class Assumptions:
    gpu: Gpu
    forward_mfu: float = 0.4
    train_mfu: float = 0.35
    update_epochs: int = 4  # svc_learner's default (PPO epochs over each batch)
    sync_bytes_per_s: float = 2e9  # shared storage: the checkpoint is written once, then read
    bytes_per_param: float = 2.0  # bf16

    def __post_init__(self) -> None:
        for name in ("forward_mfu", "train_mfu"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {value}")
        if self.update_epochs < 1 or self.sync_bytes_per_s <= 0 or self.bytes_per_param <= 0:
            raise ValueError("update_epochs must be >= 1, sync_bytes_per_s and bytes_per_param > 0")


@dataclass(frozen=True)
class BatchScale:
    """A larger batch of the same mix: ``samples`` times the samples, each ``length`` times as long."""

    samples: float = 1.0
    length: float = 1.0

    def __post_init__(self) -> None:
        if not (self.samples > 0 and self.length > 0):
            raise ValueError(f"batch scale factors must be > 0, got samples {self.samples}, length {self.length}")

    @property
    def tokens(self) -> float:
        return self.samples * self.length


@dataclass(frozen=True)
class UpdateWork:
    """One update's measured work, in units no model size changes."""

    stages: Sequence[StageCost]  # what the ledger booked over the run
    updates: int  # the policy updates those stages paid for
    trained_tiers: frozenset[int]  # the tiers whose samples the learner trains on
    plumbing_seconds: Mapping[str, float]  # the trace's mean seconds per update, by stage (others are ignored)
    # CPU seconds per update of the processes that decide for every prompt and run on no model device (the
    # scheduler: encoder, index, Redis): a device of their own, busy in proportion to the batch's samples.
    control_seconds: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.updates < 1:
            raise ValueError(f"updates must be >= 1, got {self.updates}")


@dataclass(frozen=True)
class Projection:
    device_seconds: dict[str, float]  # device (ROLLOUT_ROLES, "learner") -> busy seconds per update
    sync: float
    rollout_plumbing: float  # seconds per update on the critical path, as measured
    learner_plumbing: float

    @property
    def plumbing(self) -> float:
        return self.rollout_plumbing + self.learner_plumbing

    @property
    def rollout(self) -> float:
        """The batch's rollout: its busiest device sets the pace (the stages stream into each other)."""
        return max((self.device_seconds.get(d, 0.0) for d in ROLLOUT_ROLES), default=0.0) + self.rollout_plumbing

    @property
    def learn(self) -> float:
        return self.learner_plumbing + self.device_seconds.get("learner", 0.0) + self.sync

    @property
    def sequential(self) -> float:
        return self.rollout + self.learn

    @property
    def overlapped(self) -> float:
        return max(self.rollout, self.learn)

    @property
    def bound(self) -> str:
        """What sets the overlapped update's pace: the learner, or the busiest rollout device."""
        if self.learn >= self.rollout:
            return "the learner"
        return max(ROLLOUT_ROLES, key=lambda d: self.device_seconds.get(d, 0.0))

    @property
    def devices(self) -> int:
        return sum(1 for seconds in self.device_seconds.values() if seconds > 0)

    @property
    def busy_share(self) -> float:
        """The devices' busy seconds over what they are held for (devices x overlapped update)."""
        held = self.devices * self.overlapped
        return (sum(self.device_seconds.values()) + self.sync) / held if held else float("nan")

    def plumbing_share(self, overlapped: bool = True) -> float:
        """What the plumbing adds to an update, over the update: 0 where the other side hides it."""
        bare = replace(self, rollout_plumbing=0.0, learner_plumbing=0.0)
        wall, without = (self.overlapped, bare.overlapped) if overlapped else (self.sequential, bare.sequential)
        return (wall - without) / wall if wall else float("nan")


def _tokens_read(stage: StageCost) -> float:
    """Tokens a stage's model read (prompt and response); params x tokens over params."""
    return stage.param_tokens / stage.params if stage.params else float(stage.tokens)


def trained_tokens(work: UpdateWork) -> float:
    """Tokens (prompt and response) the learner trains on per update."""
    return sum(_tokens_read(s) for s in work.stages
               if s.stage == "generate" and s.tier in work.trained_tiers) / work.updates


def trained_samples(work: UpdateWork) -> float:
    """Samples the learner trains on per update."""
    return sum(s.items for s in work.stages if s.stage == "generate" and s.tier in work.trained_tiers) / work.updates


def deployment_batch(work: UpdateWork) -> BatchScale | None:
    """The scale from the measured batch to ``DEPLOYMENT_SAMPLES`` samples of ``DEPLOYMENT_SAMPLE_TOKENS``
    tokens (None when the learner trained on nothing)."""
    samples, tokens = trained_samples(work), trained_tokens(work)
    if not (samples and tokens):
        return None
    return BatchScale(DEPLOYMENT_SAMPLES / samples, DEPLOYMENT_SAMPLE_TOKENS / (tokens / samples))


def project(work: UpdateWork, price: PriceAs, assume: Assumptions, batch: BatchScale = BatchScale()) -> Projection:
    """``work`` at ``price``'s sizes on ``assume.gpu``; roles ``price`` does not size keep their measured size.
    ``batch``: every token times ``batch.tokens``, the control processes' seconds times ``batch.samples``;
    the plumbing's latency stays as measured. ValueError when a stage that must be priced has no size (an
    older ledger)."""
    gpu, per_update = assume.gpu, batch.tokens / work.updates
    forward_flops = gpu.bf16_flops * assume.forward_mfu
    busy: dict[str, float] = {name: seconds * batch.samples for name, seconds in work.control_seconds.items()}
    trained = level2_trained = 0.0

    def size_of(role: str, stage: StageCost) -> float:
        size = price.sizes.get(role, stage.params)
        if not size:
            raise ValueError(f"the ledger does not say what size ran {stage.stage}/{stage.tier}: rerun the bench")
        return size

    for stage in work.stages:
        role = ROLE_OF.get((stage.stage, stage.tier))
        if role is None or not (stage.items or stage.param_tokens):
            continue
        size, read = size_of(role, stage), _tokens_read(stage) * per_update
        if stage.stage == "generate":
            prompt = max(0.0, read - stage.tokens * per_update)
            decode_rate = gpu.decode_tokens_per_s * gpu.decode_ref_params / size
            seconds = stage.tokens * per_update / decode_rate + 2 * size * prompt / forward_flops
            if stage.tier in work.trained_tiers:
                trained += read
                level2_trained += read * size if stage.tier == 2 else 0.0
        else:
            seconds = 2 * size * read / forward_flops
        device = DEVICE_OF[role]
        busy[device] = busy.get(device, 0.0) + seconds
    policy = price.sizes.get("level1") or next(
        (s.params for s in work.stages if s.stage == "generate" and s.tier == 1 and s.params), 0.0)
    if trained and not policy:
        raise ValueError("the ledger does not say the policy's size: rerun the bench or name level1= in the sizes")
    busy["learner"] = ((6 * assume.update_epochs + 4) * policy * trained / (gpu.bf16_flops * assume.train_mfu)
                       + 2 * level2_trained / forward_flops)
    sync = assume.bytes_per_param * policy / assume.sync_bytes_per_s if trained else 0.0
    return Projection(busy, sync, sum(work.plumbing_seconds.get(s, 0.0) for s in ROLLOUT_PLUMBING),
                      sum(work.plumbing_seconds.get(s, 0.0) for s in LEARNER_PLUMBING))


def scaled(price: PriceAs, factor: float) -> PriceAs:
    """Every size in ``price`` times ``factor`` (the encoder, which no deployment grows, excepted)."""
    return PriceAs({role: size if role == "encoder" else size * factor for role, size in price.sizes.items()},
                   f"{price.label} x{factor:g}")


def negligible_from(work: UpdateWork, price: PriceAs, assume: Assumptions, batch: BatchScale = BatchScale(),
                    factors: Sequence[float] = SIZE_FACTORS) -> float | None:
    """The smallest factor on ``price``'s sizes from which the plumbing adds under ``NEGLIGIBLE_SHARE`` to an
    overlapped update (None: not within ``factors``)."""
    for factor in sorted(factors):
        if project(work, scaled(price, factor), assume, batch).plumbing_share() < NEGLIGIBLE_SHARE:
            return factor
    return None


def projection_lines(name: str, work: UpdateWork, price: PriceAs, assume: Assumptions) -> list[str]:
    """The arm's update at ``price``'s sizes, both ways, at the bench's batch and at a deployment's, and
    where its plumbing stops mattering."""
    batches = [("the bench's batch", BatchScale())]
    if (deployment := deployment_batch(work)) is not None:
        batches.append((f"{DEPLOYMENT_SAMPLES} samples of {DEPLOYMENT_SAMPLE_TOKENS} tokens", deployment))
    lines = [f"  {name}: {trained_samples(work):.0f} samples, {trained_tokens(work):.0f} tokens trained per update"]
    for label, batch in batches:
        p = project(work, price, assume, batch)
        by_device = ", ".join(f"{d} {s:.2f} s" for d, s in sorted(p.device_seconds.items(), key=lambda kv: -kv[1])
                              if s)
        size = negligible_from(work, price, assume, batch)
        where = (f"under {NEGLIGIBLE_SHARE:.0%} from {size:g}x these sizes on" if size is not None
                 else f"over {NEGLIGIBLE_SHARE:.0%} at every size tried")
        lines += [
            f"    {label} (x{batch.tokens:.3g} tokens): sequential {p.sequential:.2f} s, overlapped "
            f"{p.overlapped:.2f} s ({p.sequential / p.overlapped:.2f}x), bound by {p.bound}, per update on "
            f"{p.devices} {assume.gpu.name}; devices busy {p.busy_share:.0%} of the time they are held",
            f"      busy per update: {by_device}; sync {p.sync:.2f} s; plumbing {p.plumbing:.2f} s adds "
            f"{p.plumbing_share():.1%} to the overlapped update ({where})",
        ]
    return lines
