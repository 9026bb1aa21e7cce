"""Settings of the learner: one frozen object, from ``STRATA_*`` env vars and ``--flags``.

Defaults follow CleanRL / TRL where the brief says nothing; the two rules of R17 (KL warm-up,
KL-adaptive clip) are named fields. ``ppo_config()`` hands the math its part; the whole resolved
object is stored in every checkpoint (``as_log_dict``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from strata.config import StrataSettings
from svc_learner.ppo import PPOConfig

# The math's defaults, written once in ppo.py; the settings only add bounds and descriptions.
PPO_DEFAULTS = PPOConfig()


class LearnerSettings(StrataSettings):
    """PPO hyperparameters, staleness policy, checkpoints and the service's port."""

    # Model.
    policy_model_path: Path | None = Field(
        None, description="local directory of the initial policy (any HF causal LM); required to start the service"
    )
    device: str = Field("auto", description="auto, cpu, cuda or cuda:N")
    dtype: str = Field("float32", description="training dtype of the policy (float32 keeps Adam simple on CPU)")

    # Returns and advantages.
    gamma: float = Field(
        PPO_DEFAULTS.gamma, ge=0.0, le=1.0, description="discount per token (1.0: one response = one episode)"
    )
    gae_lambda: float = Field(PPO_DEFAULTS.gae_lambda, ge=0.0, le=1.0, description="GAE λ")
    norm_adv: bool = Field(PPO_DEFAULTS.norm_adv, description="whiten advantages over the batch's response tokens")

    # Clipping (R17 rule 2: adaptive clip).
    clip_mode: Literal["fixed", "adaptive"] = Field(
        PPO_DEFAULTS.clip_mode,
        description="fixed: ε = clip_coef; adaptive: ε from the batch KL to the reference (R17)",
    )
    clip_coef: float = Field(
        PPO_DEFAULTS.clip_coef, gt=0.0, lt=1.0, description="ε of the fixed clip mode (CleanRL default 0.2)"
    )
    clip_eps_low: float = Field(
        PPO_DEFAULTS.clip_eps_low, gt=0.0, lt=1.0, description="adaptive ε when the batch KL <= clip_kl_low"
    )
    clip_eps_high: float = Field(
        PPO_DEFAULTS.clip_eps_high, gt=0.0, lt=1.0, description="adaptive ε when the batch KL >= clip_kl_high"
    )
    clip_kl_low: float = Field(
        PPO_DEFAULTS.clip_kl_low, ge=0.0, description="batch KL (per token, k3) at and under which ε = eps_low"
    )
    clip_kl_high: float = Field(
        PPO_DEFAULTS.clip_kl_high, gt=0.0, description="batch KL (per token, k3) at and over which ε = eps_high"
    )
    vf_clip_coef: float = Field(
        PPO_DEFAULTS.vf_clip_coef, gt=0.0, description="value clip range, in reward units (TRL cliprange_value)"
    )
    clip_vloss: bool = Field(
        PPO_DEFAULTS.clip_vloss, description="clip the value loss around the old values (CleanRL clip_vloss)"
    )

    # KL penalty against the frozen reference (R17 rule 1: warm-up).
    kl_coef: float = Field(
        PPO_DEFAULTS.kl_coef, ge=0.0, description="target β of the per-token KL penalty to the reference model"
    )
    kl_warmup_updates: int = Field(
        PPO_DEFAULTS.kl_warmup_updates, ge=0, description="β rises linearly from 0 to kl_coef over this many updates"
    )

    # Loss weights and optimisation.
    ent_coef: float = Field(
        PPO_DEFAULTS.ent_coef, ge=0.0, description="entropy bonus weight (0: the KL penalty already regularises)"
    )
    vf_coef: float = Field(PPO_DEFAULTS.vf_coef, ge=0.0, description="value loss weight (TRL's 0.1)")
    value_trunk_grad: bool = Field(
        False, description="let the value loss train the LM trunk the value head shares (TRL); off: the head "
        "reads detached features and cannot move the policy (a fresh head's large early errors otherwise "
        "drive the LM away from the reference)")
    max_grad_norm: float = Field(
        PPO_DEFAULTS.max_grad_norm, gt=0.0, description="global gradient-norm clip per minibatch step"
    )
    learning_rate: float = Field(1e-5, gt=0.0, description="Adam learning rate (tiny CPU models want ~1e-4..1e-3)")
    adam_eps: float = Field(1e-5, gt=0.0, description="Adam ε (CleanRL uses 1e-5 rather than torch's 1e-8)")
    update_epochs: int = Field(PPO_DEFAULTS.update_epochs, ge=1, description="PPO epochs over each batch")
    minibatch_size: int = Field(PPO_DEFAULTS.minibatch_size, ge=1, description="sequences per gradient step")
    batch_size: int = Field(32, ge=1, description="samples (scored responses) per PPO update")
    follow_kl_brake: bool = Field(
        True, description="multiply kl_coef by the hacking defence's KL brake while its alarm fires (svc_reward's "
        "defence_kl_factor, read from Redis before each update); off: kl_coef alone"
    )
    target_kl: float | None = Field(
        PPO_DEFAULTS.target_kl, gt=0.0, description="stop an update's epochs once approx_kl exceeds it"
    )

    # Staleness (R13).
    max_staleness: int = Field(
        2, ge=0, description="refuse samples more than this many policy versions behind the current one (counted)"
    )
    is_truncation: float = Field(
        PPO_DEFAULTS.is_truncation, gt=0.0,
        description="c̄ of the truncated importance weights min(c̄, π_old/π_behaviour) of stale samples",
    )

    # Checkpoints and serving.
    checkpoint_dir: Path = Field(
        Path(".strata/learner/checkpoints"), description="where v<version>/ dirs are written; unset: "
        "<state_dir>/learner/checkpoints"
    )
    keep_checkpoints: int = Field(5, ge=1, description="newest checkpoints kept on disk (>= max_staleness + 1)")
    grpc_port: int = Field(50055, ge=0, le=65535, description="port of the Learner gRPC service (0: any free port)")
    seed: int = Field(0, description="seed of torch and of the minibatch shuffling")

    # The service around the math (svc_learner.service / worker).
    group_id: str = Field("svc-learner", description="consumer group on strata.rewards.scored (one learner per group)")
    train_on_escalated: bool = Field(
        True, description="train on Level-1 samples that escalated too (their light-RM reward is the policy's signal)"
    )
    train_tiers: str = Field(
        "1,2",
        description="comma-separated tiers whose final rewards train the policy: the policy's own Level-1 samples "
        "and Level-2's answers, off-policy rows weighted by min(c̄, π_old/π_level2), when the Level-2 model shares "
        "the policy's vocabulary (else Level-1 only, said at start); 1: Level-1 only (docs/learner.md says when)",
    )
    center_rewards_by_source: bool = Field(
        True, description="center Level-1 (light RM) and Level-2 (strong RM or human) rewards of a batch on the "
        "batch mean separately: their scorers read on different scales (docs/learner.md)"
    )
    level2_model_path: Path | None = Field(
        None, description="the Level-2 generator's model: the behaviour policy of Level-2 samples (loaded once, "
        "frozen, on first use); unset: the built zoo's Level-2 model; none, or another vocabulary than the "
        "policy's: Level-2 samples are skipped"
    )  # fmt: skip
    tokenizer_id: str | None = Field(
        None, description="key of the response token ids in the content store; unset: derived from the initial "
        "policy's tokenizer exactly as the HF generator derives it (tok-<vocab sha>)"
    )  # fmt: skip
    level2_tokenizer_id: str | None = Field(
        None, description="key of the Level-2 generator's response token ids; unset: derived from the Level-2 "
        "model's tokenizer as every generator backend derives it"
    )  # fmt: skip
    checkpoint_every_updates: int = Field(
        1, ge=1, description="PPO updates per checkpoint; each checkpoint is a policy version published to generators"
    )
    max_pending_samples: int = Field(
        256, ge=1, description="accepted samples held in memory at most; beyond it the intake pauses (backpressure)"
    )
    measure_sync: bool = Field(
        True, description="tail strata.rollouts.generated to time publish -> first rollout on the new version"
    )
    dedupe_ttl_s: int = Field(
        7 * 24 * 3600, ge=1, description="how long applied sample ids stay in Redis to refuse duplicate events"
    )

    @property
    def trained_tiers(self) -> frozenset[int]:
        """The tiers of ``train_tiers`` as numbers (1 = Level-1, 2 = Level-2)."""
        return frozenset(int(part) for part in self.train_tiers.split(",") if part.strip())

    @model_validator(mode="before")
    @classmethod
    def _checkpoints_under_the_state_dir(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        # Unset, the checkpoints follow STRATA_STATE_DIR like every other piece of runtime state.
        if data.get("checkpoint_dir") is None:
            state_dir = data.get("state_dir") or cls.model_fields["state_dir"].default
            data = {**data, "checkpoint_dir": Path(state_dir) / "learner" / "checkpoints"}
        # Absolute: PolicyUpdated carries the path to processes in other working directories, and a
        # follower reads a relative one as relative to its checkpoint root, not to the learner's cwd.
        if isinstance(data["checkpoint_dir"], str | Path) and data["checkpoint_dir"]:
            data = {**data, "checkpoint_dir": Path(data["checkpoint_dir"]).expanduser().absolute()}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> LearnerSettings:
        if self.clip_eps_low > self.clip_eps_high:
            raise ValueError("clip_eps_low must be <= clip_eps_high")
        if self.clip_kl_low >= self.clip_kl_high:
            raise ValueError("clip_kl_low must be < clip_kl_high")
        if self.minibatch_size > self.batch_size:
            raise ValueError("minibatch_size must be <= batch_size")
        if self.keep_checkpoints < self.max_staleness + 1:
            raise ValueError("keep_checkpoints must be >= max_staleness + 1 (stale samples need their checkpoint)")
        tiers = [part.strip() for part in self.train_tiers.split(",") if part.strip()]
        if not tiers or any(part not in ("1", "2") for part in tiers):
            raise ValueError(f"train_tiers must list tiers 1 and/or 2, got {self.train_tiers!r}")
        if self.max_pending_samples < self.batch_size:
            raise ValueError("max_pending_samples must be >= batch_size (a batch must fit in memory)")
        return self

    def ppo_config(self) -> PPOConfig:
        """The part of the settings that ``ppo_update`` reads."""
        return PPOConfig(
            gamma=self.gamma,
            gae_lambda=self.gae_lambda,
            clip_mode=self.clip_mode,
            clip_coef=self.clip_coef,
            clip_eps_low=self.clip_eps_low,
            clip_eps_high=self.clip_eps_high,
            clip_kl_low=self.clip_kl_low,
            clip_kl_high=self.clip_kl_high,
            kl_coef=self.kl_coef,
            kl_warmup_updates=self.kl_warmup_updates,
            ent_coef=self.ent_coef,
            vf_coef=self.vf_coef,
            clip_vloss=self.clip_vloss,
            vf_clip_coef=self.vf_clip_coef,
            max_grad_norm=self.max_grad_norm,
            update_epochs=self.update_epochs,
            minibatch_size=self.minibatch_size,
            norm_adv=self.norm_adv,
            target_kl=self.target_kl,
            is_truncation=self.is_truncation,
            seed=self.seed,
        )
