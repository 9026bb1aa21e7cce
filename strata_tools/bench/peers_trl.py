"""The TRL arm of ``strata bench peers``: TRL's RLOO trainer on the zoo's Level-1, rewarded by Strata's light RM.

Run in a process of its own so that its peak memory is its own::

    python -m strata_tools.bench.peers_trl JOB.json RESULT.json

TRL's current release has no PPO (``trl.experimental.ppo`` ended with 1.12); RLOO is its closest trainer:
the KL to the reference policy is in the reward, the advantage is the sample's reward minus the mean of
the other samples of its prompt (no value head), and the update is PPO's clipped ratio over
``num_iterations`` epochs. Our RM scores a distribution over score bins, so TRL is given a reward
function (the RM's expected score over its bins, as svc_reward serves it) rather than a one-logit model.

What TRL measures itself is read from it: ``step_time`` per optimizer step and ``reward`` per generation
from ``trainer.state.log_history``, and generation's time from TRL's own profiling context
(``transformers.generate``), which TRL otherwise sends only to wandb/mlflow/trackio.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from strata_tools.infra.process import cpu_seconds

TRL_VERSION = "1.16.0"  # the `peers` extra's pin
INSTALL_HINT = f"pip install -e '.[peers]'  (TRL {TRL_VERSION}, with accelerate and datasets)"


@dataclass(frozen=True)
class PeersJob:
    """What every arm of the bench trains with: the same policy, reward model, prompts and sampling."""

    policy_dir: str
    light_rm: list[str]                 # the served light RM's member directories (mean of their rewards)
    prompts: list[str]                  # training prompts, in the order they are first sent
    directions: list[list[str]]         # the directions line each prompt is served with (Level-0)
    prompts_per_round: int              # Strata's rounds (strata_tools.train); TRL reads the same stream
    repeat_share: float
    paraphrase_share: float
    updates: int
    samples_per_update: int             # rollouts per policy update
    n_samples: int                      # rollouts per prompt
    minibatch_size: int
    epochs: int                         # passes over each update's samples
    learning_rate: float
    kl_coef: float
    clip_coef: float
    max_grad_norm: float
    adam_eps: float
    temperature: float
    top_p: float
    max_new_tokens: int
    rm_max_length: int
    seed: int
    threads: int
    out_dir: str                        # the trained policy is saved here
    strong_rm: str = ""                 # the strong RM's directory: the conventional arm scores with it
    # Strata's services: "processes" (one each, as deployed) or "threads" (one process, one interpreter lock).
    stack: str = "processes"
    service_threads: int = 1            # torch threads of each Strata service process

    @classmethod
    def read(cls, path: str | Path) -> PeersJob:
        return cls(**json.loads(Path(path).read_text()))

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self)))


@dataclass
class ArmResult:
    """One arm's figures, as the bench prints them; every time is wall seconds on this machine."""

    name: str
    update_seconds: list[float] = field(default_factory=list)      # per policy update, in order
    generation_seconds: list[float] = field(default_factory=list)  # generation's share of each update
    samples: int = 0                    # rollouts generated and scored
    train_seconds: float = 0.0          # from the first rollout to the last update
    peak_rss_mb: float = 0.0
    param_tokens: float = 0.0           # booked cost: generation + reward-model calls (params x tokens)
    rewards: list[float] = field(default_factory=list)             # mean reward of each update's samples
    policy_dir: str = ""
    notes: list[str] = field(default_factory=list)
    updates_done: int = 0               # policy updates the booked cost paid for (a round may complete more)
    # Rollouts of the tiers its learner trains on (Strata: Level-1; both under train_tiers=1,2); None: all.
    trained_tier_samples: int | None = None
    critical_path: dict[str, float] = field(default_factory=dict)  # Strata: mean seconds per update by stage
    cpu_seconds: dict[str, float] = field(default_factory=dict)    # process -> CPU seconds over the training
    # Strata: the ledger's stages over the training (strata.ledger.StageCost's fields) and the tiers the
    # learner trained on, for the projection at other sizes (strata_tools.projection).
    ledger_stages: list[dict[str, Any]] = field(default_factory=list)
    trained_tiers: list[int] = field(default_factory=list)

    @property
    def updates(self) -> int:
        """The updates the training window completed (its CPU and booked cost paid for)."""
        return self.updates_done or len(self.update_seconds)

    @property
    def cpu_per_update(self) -> dict[str, float]:
        """Each process's CPU seconds per update (over the updates the training window completed)."""
        updates = self.updates
        return {name: seconds / updates for name, seconds in self.cpu_seconds.items()} if updates else {}

    def seconds_per_update(self, warmup: int = 1) -> float:
        """Median over updates, the first ``warmup`` left out (model loading, first-call allocations)."""
        steady = self.update_seconds[warmup:] or self.update_seconds
        return statistics.median(steady) if steady else float("nan")

    @property
    def generation_share(self) -> float:
        total = sum(self.update_seconds)
        return sum(self.generation_seconds) / total if total else float("nan")

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.train_seconds if self.train_seconds else float("nan")

    @classmethod
    def read(cls, path: str | Path) -> ArmResult:
        return cls(**json.loads(Path(path).read_text()))

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2))


def peak_rss_mb() -> float:
    """This process's peak resident memory (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def group_per_update(values: Sequence[float], steps_per_update: int) -> list[float]:
    """Per-step values summed into per-update totals (``steps_per_update`` optimizer steps each)."""
    return [sum(values[i : i + steps_per_update]) for i in range(0, len(values) - steps_per_update + 1,
                                                                 steps_per_update)]


class LightRmReward:
    """TRL reward function: the light RM's expected score of each completion to its raw prompt (the mean
    over the ensemble's members, T = 1, as svc_reward serves it), booking params x tokens as the ledger
    does for generation and for each RM call."""

    __name__ = "light_rm"  # TRL names the reward's metrics after it

    def __init__(self, member_dirs: Sequence[str], policy_params: int, tokenizer: Any, max_length: int) -> None:
        from strata.models.loading import load_reward_model

        self.members = [load_reward_model(d, device="cpu") for d in member_dirs]
        self.policy_params = policy_params
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.generation_param_tokens = 0.0
        self.rm_param_tokens = 0.0
        self.samples = 0

    def __call__(self, prompts: list[str], completions: list[str], completion_ids: list[list[int]],
                 raw_prompt: list[str], **_: Any) -> list[float | None]:
        from strata.models.reward import reward_logits_and_lengths
        from svc_reward.scoring import aggregate, tempered_reward

        prompt_tokens = [len(ids) for ids in self.tokenizer(prompts)["input_ids"]]
        generated = sum(p + len(c) for p, c in zip(prompt_tokens, completion_ids, strict=True))
        self.generation_param_tokens += float(self.policy_params) * generated
        per_member = []
        for rm in self.members:
            logits, lengths = reward_logits_and_lengths(rm, raw_prompt, completions, max_length=self.max_length)
            self.rm_param_tokens += float(rm.n_params) * sum(lengths)
            per_member.append(tempered_reward(logits, 1.0))
        self.samples += len(completions)
        rewards: list[float | None] = aggregate(per_member, "mean")[0].tolist()
        return rewards


def _profiled_durations() -> dict[str, list[float]]:
    """TRL's own profiling timings (name -> durations in order), kept instead of dropped when no
    experiment tracker is configured."""
    from trl.extras import profiling

    durations: dict[str, list[float]] = defaultdict(list)
    original = profiling.ProfilingContext._log_metrics

    def keep(self: Any, duration: float) -> None:
        durations[self.name].append(duration)
        original(self, duration)

    profiling.ProfilingContext._log_metrics = keep  # type: ignore[method-assign]
    return durations


def rloo_config(job: PeersJob, output_dir: str) -> Any:
    """TRL's RLOO settings matched to the Strata learner's recipe (one update = ``samples_per_update``
    rollouts, ``epochs`` passes in minibatches of ``minibatch_size``; a constant learning rate, Adam's ε,
    the clip range and gradient clipping as the learner has them), on the CPU in float32."""
    from trl import RLOOConfig

    steps_per_generation = job.samples_per_update // job.minibatch_size
    return RLOOConfig(
        output_dir=output_dir, use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False,
        per_device_train_batch_size=job.minibatch_size, steps_per_generation=steps_per_generation,
        num_generations=job.n_samples, num_iterations=job.epochs,
        max_steps=job.updates * steps_per_generation * job.epochs,
        max_completion_length=job.max_new_tokens, temperature=job.temperature, top_p=job.top_p, top_k=0,
        beta=job.kl_coef, epsilon=job.clip_coef, learning_rate=job.learning_rate, lr_scheduler_type="constant",
        adam_epsilon=job.adam_eps, max_grad_norm=job.max_grad_norm, weight_decay=0.0, seed=job.seed, data_seed=job.seed,
        logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True, use_vllm=False,
        dataloader_num_workers=0, dataloader_pin_memory=False,
        shuffle_dataset=False,  # the prompt stream in Strata's order
    )


def check_job(job: PeersJob) -> None:
    """The batch shapes TRL accepts, refused with the field to change before any model loads."""
    if job.n_samples < 2:
        raise ValueError("n_samples must be >= 2: RLOO's baseline is the other samples of the same prompt")
    if job.samples_per_update % job.minibatch_size or job.samples_per_update % job.n_samples:
        raise ValueError(f"samples_per_update ({job.samples_per_update}) must be a multiple of minibatch_size "
                         f"({job.minibatch_size}) and of n_samples ({job.n_samples})")


def run_trl(job: PeersJob) -> ArmResult:
    """Train with TRL's RLOO for ``job.updates`` updates; the trained policy is saved to ``job.out_dir``."""
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import RLOOTrainer

    from strata.models.loading import params_on_disk
    from strata.models.prompts import PromptFormat

    check_job(job)
    torch.set_num_threads(job.threads)
    tokenizer = AutoTokenizer.from_pretrained(job.policy_dir)
    tokenizer.padding_side = "left"
    prompt_format = PromptFormat.of(tokenizer)
    texts = [prompt_format.generator_text(p, tuple(d)) for p, d in zip(job.prompts, job.directions, strict=True)]
    dataset = Dataset.from_dict({"prompt": texts, "raw_prompt": list(job.prompts)})
    reward = LightRmReward(job.light_rm, params_on_disk(job.policy_dir), tokenizer, job.rm_max_length)
    durations = _profiled_durations()
    with tempfile.TemporaryDirectory(prefix="strata-peers-trl-") as scratch:
        trainer = RLOOTrainer(model=job.policy_dir, reward_funcs=reward, args=rloo_config(job, scratch),
                              train_dataset=dataset, processing_class=tokenizer)
        started, cpu_started = time.perf_counter(), cpu_seconds(os.getpid())
        trainer.train()
        train_seconds, cpu_spent = time.perf_counter() - started, cpu_seconds(os.getpid()) - cpu_started
        trainer.save_model(job.out_dir)
    tokenizer.save_pretrained(job.out_dir)
    _copy_missing(Path(job.policy_dir), Path(job.out_dir))  # the zoo's descriptor, so it loads as the policy did
    steps_per_update = job.samples_per_update // job.minibatch_size * job.epochs
    history = trainer.state.log_history
    generate = next((v for k, v in durations.items() if k.endswith("transformers.generate")), [])
    return ArmResult(
        name=f"TRL {_trl_version()} RLOO",
        update_seconds=group_per_update([h["step_time"] for h in history if "step_time" in h], steps_per_update),
        generation_seconds=list(generate),
        samples=reward.samples, train_seconds=train_seconds, peak_rss_mb=peak_rss_mb(),
        cpu_seconds={"trl": cpu_spent},
        param_tokens=reward.generation_param_tokens + reward.rm_param_tokens,
        rewards=[h["reward"] for h in history if h.get("reward") is not None],
        policy_dir=job.out_dir,
        notes=[f"{len(history)} log records; generation timed by TRL's profiling context",
               f"booked params x tokens: generate {reward.generation_param_tokens:.2e}, "
               f"score {reward.rm_param_tokens:.2e}"],
    )


def _trl_version() -> str:
    import trl

    return str(trl.__version__)


def _copy_missing(source: Path, target: Path) -> None:
    for item in source.iterdir():
        if item.is_file() and not (target / item.name).exists():
            shutil.copy2(item, target / item.name)


def main(argv: Sequence[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m strata_tools.bench.peers_trl JOB.json RESULT.json", file=sys.stderr)
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    try:
        import trl  # noqa: F401
    except ModuleNotFoundError:
        print(f"TRL is not installed: {INSTALL_HINT}", file=sys.stderr)
        return 3
    run_trl(PeersJob.read(argv[0])).write(argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
