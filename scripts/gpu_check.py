"""The checks behind ``scripts/gpu-check`` (docs/gpu.md): Strata's CUDA paths, end to end, on one GPU.

Prints one line per check on stdout, ``gpu-check <check> ok|FAIL|skip <detail>``, then one summary
line; everything else (library logs, vLLM's engine processes) goes to stderr. Exit status 1 if a check
failed. Without a CUDA GPU every check prints ``skip no CUDA`` and the exit status is 0.

``--device cpu`` runs the same HF, learner, weight-sync and bench checks on the CPU (the vLLM checks
skip): a dry run of this script's own logic on a machine without a GPU.

Set by ``scripts/gpu-check``: ``STRATA_GPU_CHECK_DEADLINE`` (epoch seconds to be done by; checks that
cannot start in time print ``skip``), ``STRATA_GPU_CHECK_VLLM_SKIP`` (why the vLLM checks cannot run,
e.g. vLLM missing and no network to install it), ``STRATA_GPU_CHECK_LOG`` (where stderr goes).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import logging
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import torch

from strata.models.loading import _load_tokenizer
from strata.models.prompts import PromptFormat
from strata.models.tiny import build_tiny_model
from strata.models.tokens import tokenizer_id
from strata.sampling import Sampling

log = logging.getLogger("gpu-check")

CHECKS = ("cuda", "hf-generate", "learner-update", "weight-sync", "vllm-generate", "vllm-reload", "bench-generator")
BUDGET_S = {"cuda": 60, "hf-generate": 180, "learner-update": 180, "weight-sync": 90, "vllm-generate": 300,
            "vllm-reload": 120, "bench-generator": 300}  # each check's own limit, within the overall deadline
MIN_START_S = 15  # a check with less time left than this is skipped, not started
PROMPTS = (("How do I reverse a linked list?", ("give_code", "give_steps")),
           ("Please compare two ways to sort a list, thank you!", ("compare_options",)),
           ("Explain gradient descent.", ("explain_principle",)),
           ("Give me the steps to bake bread.", ()))
REWARDS = (1.0, 4.0, 2.5, 3.0)
VLLM_OPTIONS = {"gpu_memory_utilization": 0.3}  # leaves room for the HF and learner models in this process


class CheckFailed(Exception):
    """A check's expectation that did not hold; the message is the detail printed."""


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


@contextlib.contextmanager
def time_limit(seconds: int) -> Iterator[None]:
    """Raise ``TimeoutError`` in this (main) thread after ``seconds``."""

    def expire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"timed out after {seconds}s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


class Report:
    """Runs checks and prints their lines to ``out``."""

    def __init__(self, out: TextIO, deadline: float) -> None:
        self.out = out
        self.deadline = deadline
        self.statuses: dict[str, str] = {}
        self.started = time.monotonic()

    def line(self, check: str, status: str, detail: str) -> None:
        self.statuses[check] = status
        print(f"gpu-check {check} {status} {one_line(detail)}", file=self.out, flush=True)
        log.info("%s: %s %s", check, status, detail)

    def run(self, check: str, body: Callable[[], tuple[str, Any]], skip: str | None = None) -> Any:
        """``body()`` returns (detail, value for later checks); its value, or None if it did not pass."""
        if skip:
            self.line(check, "skip", skip)
            return None
        left = self.deadline - time.time()
        if left < MIN_START_S:
            self.line(check, "skip", "no time left in the 8-minute budget")
            return None
        limit = int(min(BUDGET_S[check], left))
        log.info("--- %s (limit %ds)", check, limit)
        try:
            with time_limit(limit):
                detail, value = body()
        except CheckFailed as exc:
            self.line(check, "FAIL", str(exc))
            return None
        except Exception as exc:  # any error is the check's result, and the next checks still run
            log.exception("%s failed", check)
            self.line(check, "FAIL", f"{type(exc).__name__}: {exc}")
            return None
        self.line(check, "ok", detail)
        return value

    def summary(self, log_path: str | None) -> int:
        counts = {status: list(self.statuses.values()).count(status) for status in ("ok", "FAIL", "skip")}
        failed = counts["FAIL"] > 0
        where = f"; log {log_path}" if log_path else ""
        print(f"gpu-check summary {'FAIL' if failed else 'ok'} {counts['ok']} ok, {counts['FAIL']} FAIL, "
              f"{counts['skip']} skip in {time.monotonic() - self.started:.0f}s{where}", file=self.out, flush=True)
        return 1 if failed else 0


class Models:
    """Tiny random checkpoints, built on first use into ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._built: dict[str, Path] = {}

    def llama(self, seed: int = 0) -> Path:
        name = f"llama-{seed}"
        if name not in self._built:
            # Head size 64 (256 / 4): the smallest every vLLM attention backend takes.
            self._built[name] = build_tiny_model("llama", self.root / name, seed=seed, hidden=256, heads=4)
        return self._built[name]


def make_requests(max_new_tokens: int = 16) -> list[Any]:
    from svc_generator.backends.base import GenerationRequest

    return [GenerationRequest(prompt, directions, Sampling(temperature=0.9, top_p=0.9, max_new_tokens=max_new_tokens,
                                                           seed=index))
            for index, (prompt, directions) in enumerate(PROMPTS)]


def check_outputs(backend: Any, batch: Sequence[Any], outputs: Sequence[Any]) -> int:
    """The generator contract: prompt ids as the learner rebuilds them, bounded length, finished = stopped."""
    prompt_format = PromptFormat.of(backend.tokenizer if hasattr(backend, "tokenizer") else backend.lm.tokenizer)
    stops = set(getattr(backend, "stop_ids", ()) or ())
    expect(len(outputs) == len(batch), f"{len(outputs)} outputs for {len(batch)} requests")
    for request, output in zip(batch, outputs, strict=True):
        expected = len(prompt_format.prompt_ids(request.prompt, request.directions))
        expect(output.prompt_tokens == expected,
               f"prompt_tokens {output.prompt_tokens}, the learner rebuilds {expected}")
        expect(1 <= len(output.token_ids) <= request.sampling.max_new_tokens,
               f"{len(output.token_ids)} response tokens for max_new_tokens={request.sampling.max_new_tokens}")
        if stops:
            expect(output.finished == (output.token_ids[-1] in stops), "finished does not match the last token")
    return sum(len(o.token_ids) for o in outputs)


def file_digest(files: Sequence[Path], dtype: str, tied: bool) -> float:
    """Sum of |w| over a checkpoint's LM tensors cast to the engine's dtype (what the engine should hold)."""
    from safetensors.torch import load_file

    total = 0.0
    for path in files:
        for name, tensor in load_file(str(path)).items():
            if tied and name == "lm_head.weight":
                continue  # the engine shares the embedding
            total += tensor.to(getattr(torch, dtype)).double().abs().sum().item()
    return total


@dataclass
class CheckRun:
    """What the checks share: the device, the temporary root and its tiny models, the deadline, and the
    values earlier checks left for later ones (``state``: the HF backend, the learner engine, ...)."""

    device: str
    root: Path
    models: Models
    deadline: float
    state: dict[str, Any] = field(default_factory=dict)


def check_cuda(run: CheckRun) -> tuple[str, Any]:
    """A matmul on the GPU; its name, memory and the torch and CUDA versions."""
    if run.device == "cpu":
        return "cpu dry run", None
    x = torch.ones(256, 256, device="cuda")
    expect((x @ x).sum().item() == 256**3, "a matmul on the GPU gave a wrong sum")
    props = torch.cuda.get_device_properties(0)
    return (f"{torch.cuda.device_count()} GPU(s); cuda:0 {props.name}, {props.total_memory / 2**30:.0f} GiB; "
            f"torch {torch.__version__} CUDA {torch.version.cuda}"), None


def check_hf_generate(run: CheckRun) -> tuple[str, Any]:
    """The HF backend generates on the device, within the generator contract."""
    from svc_generator.backends.hf import HfBackend

    backend = HfBackend(str(run.models.llama()), device=run.device)
    expect(backend.device.startswith(run.device), f"the HF backend runs on {backend.device}, not {run.device}")
    batch = make_requests()
    started = time.perf_counter()
    outputs = backend.generate(batch)
    elapsed = time.perf_counter() - started
    tokens = check_outputs(backend, batch, outputs)
    run.state["hf"], run.state["hf_outputs"] = backend, outputs
    dtype = next(backend.lm.model.parameters()).dtype
    return f"{backend.device} ({dtype}): {tokens} tokens for {len(batch)} requests in {elapsed:.2f}s", backend


def check_learner_update(run: CheckRun) -> tuple[str, Any]:
    """One PPO update of the learner on the device from a full batch, with finite metrics and a checkpoint."""
    from svc_learner.config import LearnerSettings
    from svc_learner.core import LearnerEngine, Outcome, Sample, Source

    policy = run.models.llama()
    settings = LearnerSettings(policy_model_path=policy, checkpoint_dir=run.root / "ckpt", device=run.device,
                               batch_size=len(PROMPTS), minibatch_size=2, update_epochs=1, train_tiers="1")
    engine = LearnerEngine.start(settings, policy, initial_offsets={("rewards", 0): 0})
    prompt_format = PromptFormat.of(engine.tokenizer)
    outputs = run.state.get("hf_outputs")
    fallback = tuple(engine.tokenizer("Here is a short example.", add_special_tokens=False)["input_ids"])
    for offset, ((prompt, directions), reward) in enumerate(zip(PROMPTS, REWARDS, strict=True)):
        response = outputs[offset].token_ids if outputs else fallback  # generated, when hf-generate ran
        sample = Sample(f"gpu-check:{offset}", Source("rewards", 0, offset),
                        tuple(prompt_format.prompt_ids(prompt, directions)), tuple(response), reward, 0)
        expect(engine.offer(sample) is Outcome.ACCEPTED, f"sample {offset} was not accepted")
    started = time.perf_counter()
    result = engine.update()
    elapsed = time.perf_counter() - started
    expect(result is not None and result.checkpoint is not None,
           "no update (or no checkpoint) from a full batch")
    bad = sorted(k for k, v in result.metrics.items() if not math.isfinite(v))
    expect(not bad, f"metrics not finite: {', '.join(bad[:5])}")
    where = str(next(engine.policy.parameters()).device)
    expect(where.startswith(run.device), f"the policy trained on {where}, not {run.device}")
    run.state["engine"], run.state["checkpoint"] = engine, result.checkpoint.info.path
    return (f"step {result.step} on {where} in {elapsed:.2f}s, kl {result.metrics['charts/kl']:.4f}; "
            f"wrote {result.checkpoint.info.path.name}"), engine


def check_weight_sync(run: CheckRun) -> tuple[str, Any]:
    """The HF backend loads the learner's checkpoint and then holds exactly the learner's tensors."""
    backend, engine, checkpoint = run.state["hf"], run.state["engine"], run.state["checkpoint"]
    started = time.perf_counter()
    backend.load_weights(str(checkpoint))
    elapsed = time.perf_counter() - started
    trained, served = engine.policy.lm.state_dict(), backend.lm.model.state_dict()
    differ = [name for name, tensor in trained.items() if name not in served
              or not torch.equal(served[name], tensor.to(served[name].device, served[name].dtype))]
    expect(not differ, f"{len(differ)} of {len(trained)} tensors differ from the learner's, e.g. {differ[:3]}")
    return f"{len(trained)} tensors equal to the learner's {checkpoint.name} after {elapsed:.2f}s", None


def check_vllm_generate(run: CheckRun) -> tuple[str, Any]:
    """The vLLM backend starts, keys token ids as the HF backend does, and repeats a seeded request."""
    import vllm

    from svc_generator.backends.vllm_backend import VllmBackend
    from svc_generator.config import GeneratorSettings

    started = time.perf_counter()
    backend = VllmBackend(str(run.models.llama()), GeneratorSettings(backend="vllm", device="cuda"),
                          engine_options=VLLM_OPTIONS)
    start_s = time.perf_counter() - started
    hf_id = tokenizer_id(_load_tokenizer(run.models.llama(), padding_side="left"))
    expect(backend.tokenizer_id == hf_id, f"token ids keyed {backend.tokenizer_id}, the HF backend's {hf_id}")
    batch = make_requests()
    started = time.perf_counter()
    outputs = backend.generate(batch)
    elapsed = time.perf_counter() - started
    tokens = check_outputs(backend, batch, outputs)
    again = backend.generate(batch[:1])[0].token_ids
    expect(again == outputs[0].token_ids, "a seeded request gave other tokens the second time")
    run.state["vllm"], run.state["vllm_tokens"] = backend, [o.token_ids for o in outputs]
    detail = (f"vllm {vllm.__version__} on {backend.device} ({backend.dtype}): engine up in {start_s:.0f}s, "
              f"{tokens} tokens for {len(batch)} requests in {elapsed:.2f}s, ids under {backend.tokenizer_id}")
    return detail, None


def check_vllm_reload(run: CheckRun) -> tuple[str, Any]:
    """vLLM reloads other weights in place, and then the learner's checkpoint, serving what the files hold."""
    from svc_generator.backends.vllm_backend import weight_files

    backend = run.state["vllm"]
    expect(backend.in_place_reload, "this vLLM has no worker_extension_cls/collective_rpc: weight sync "
                                    "rebuilds the engine instead of reloading in place")
    other = run.models.llama(seed=1)  # same architecture and tokenizer, other weights
    backend.load_weights(str(other))
    expect(backend.last_reload_mode == "in_place", f"reloaded by {backend.last_reload_mode}, not in place")
    other_s = backend.last_reload_s
    served, wanted = backend.weights_digest(), file_digest(weight_files(other), backend.dtype, tied=True)
    changed = [o.token_ids for o in backend.generate(make_requests())] != run.state["vllm_tokens"]
    expect(math.isclose(served, wanted, rel_tol=1e-6),
           f"served weights sum |w| = {served:.6g}, the checkpoint's {wanted:.6g} (outputs changed: {changed})")
    expect(changed, "the same seeded outputs after loading other weights")
    detail = f"in place: {other_s:.3f}s for another model (outputs changed, weights match the file)"
    checkpoint = run.state.get("checkpoint")
    if checkpoint is not None:  # the production path: a learner checkpoint, value head beside the LM
        backend.load_weights(str(checkpoint))
        served, wanted = backend.weights_digest(), file_digest(weight_files(checkpoint), backend.dtype, True)
        expect(math.isclose(served, wanted, rel_tol=1e-6),
               f"after the learner's {checkpoint.name}: served sum |w| {served:.6g}, file {wanted:.6g}")
        detail += f"; {backend.last_reload_s:.3f}s for the learner's {checkpoint.name} (weights match)"
    return detail, None


def check_bench_generator(run: CheckRun) -> tuple[str, Any]:
    """``strata bench generator`` on the device, in a subprocess; its last line."""
    limit = int(max(10, min(BUDGET_S["bench-generator"], run.deadline - time.time()) - 5))
    command = [sys.executable, "-m", "strata_tools.cli.main", "bench", "generator", "--device", run.device,
               "--model", str(run.models.llama()), "--prompts", "16", "--clients", "8", "--max-new-tokens", "16"]
    # The bench also measures the zoo's Level-1 model (building the zoo if needed): the ci zoo is
    # the one that fits in the budget, unless the caller picked one.
    env = {**os.environ, "STRATA_ZOO_PRESET": os.environ.get("STRATA_ZOO_PRESET", "ci")}
    log.info("running %s (STRATA_ZOO_PRESET=%s)", " ".join(command), env["STRATA_ZOO_PRESET"])
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=limit, env=env, check=False)
    except subprocess.TimeoutExpired as exc:
        output = [text.decode(errors="replace") if isinstance(text, bytes) else (text or "")
                  for text in (exc.stdout, exc.stderr)]
        sys.stderr.write("".join(output))
        last = [line for line in "".join(output).splitlines() if line.strip()] or ["(no output)"]
        raise CheckFailed(f"timed out after {limit}s; last line: {last[-1]}") from exc
    sys.stderr.write(done.stdout + done.stderr)
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    if done.returncode != 0:
        raise CheckFailed(f"exit {done.returncode}: {(errors or lines or ['(no output)'])[-1]}")
    return (lines or ["(no output)"])[-1], None


# Each check's body, in the order of CHECKS.
CHECK_BODIES: tuple[Callable[[CheckRun], tuple[str, Any]], ...] = (
    check_cuda, check_hf_generate, check_learner_update, check_weight_sync, check_vllm_generate, check_vllm_reload,
    check_bench_generator)
# What a check takes from earlier ones: state key -> the check that puts it there.
NEEDS = {"weight-sync": {"hf": "hf-generate", "engine": "learner-update"},
         "vllm-reload": {"vllm": "vllm-generate"}}


def split_stdout() -> TextIO:
    """The real stdout, for our lines; fd 1 becomes stderr for everything else."""
    # Our lines go to the real stdout; everything else written to fd 1 (vLLM logs to stdout, and its
    # engine processes inherit fd 1) goes to stderr.
    sys.stdout.flush()
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    return out


def skip_reasons(report: Report, device: str) -> tuple[str | None, str | None]:
    """Why every check skips (no GPU, reported here as the cuda check), and why the vLLM checks skip."""
    no_gpu = None
    if device == "cuda" and not torch.cuda.is_available():
        no_gpu = "no CUDA"
        report.line("cuda", "skip", f"no CUDA (torch {torch.__version__}, built for CUDA {torch.version.cuda})")
    vllm_skip = no_gpu or ("--device cpu" if device == "cpu" else None) or os.environ.get("STRATA_GPU_CHECK_VLLM_SKIP")
    if not vllm_skip and importlib.util.find_spec("vllm") is None:
        vllm_skip = "vllm is not installed (scripts/gpu-check installs it when the package index is reachable)"
    return no_gpu, vllm_skip


def run_checks(report: Report, run: CheckRun, no_gpu: str | None, vllm_skip: str | None) -> None:
    """Every check in order, each skipped when the GPU, vLLM or a check it needs is missing."""
    for check, body in zip(CHECKS, CHECK_BODIES, strict=True):
        if check == "cuda" and no_gpu:
            continue  # already reported
        skip = no_gpu
        if not skip and check.startswith("vllm-"):
            skip = vllm_skip
        missing = [source for key, source in NEEDS.get(check, {}).items() if key not in run.state]
        if not skip and missing:
            skip = f"needs {' and '.join(missing)} to pass first"
        report.run(check, functools.partial(body, run), skip)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/gpu-check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cpu: dry-run the non-vLLM checks on the CPU (tests this script)")
    args = parser.parse_args(argv)

    out = split_stdout()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    deadline = float(os.environ.get("STRATA_GPU_CHECK_DEADLINE") or time.time() + 470)
    report = Report(out, deadline)
    no_gpu, vllm_skip = skip_reasons(report, args.device)

    with tempfile.TemporaryDirectory(prefix="strata-gpu-check-") as tmp:
        root = Path(tmp)
        run = CheckRun(args.device, root, Models(root / "models"), deadline)
        run_checks(report, run, no_gpu, vllm_skip)
        run.state.clear()  # engines go before the temporary directory
    return report.summary(os.environ.get("STRATA_GPU_CHECK_LOG"))


if __name__ == "__main__":
    sys.exit(main())
