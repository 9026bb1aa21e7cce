"""A PPO update beside a generating process, at several torch thread counts: what a shared CPU costs.

Strata's learner trains while a generator writes the next batch (R15), each in a process of its own. On
a CPU they share, each process's torch threads decide whether they help or spin against each other.
This times the learner's PPO update (``svc_learner.ppo.ppo_update``, the service's defaults: 4 epochs
in minibatches of 8) on a batch of 32 of the zoo policy's own answers, alone and beside a second process
that generates with the same model (batches of 8, 64 new tokens), for each layout
``learner threads + generator threads``:

    STRATA_ZOO_PRESET=default .venv/bin/python scripts/threads_shared_cpu.py --layouts 1,2,1+1,2+2,2+1

A layout ``N`` is the update alone at N threads; ``N+M`` is the update at N threads beside the generator
at M; a trailing ``p`` (``2p+1``) runs that side with ``OMP_WAIT_POLICY=PASSIVE`` (idle threads sleep
instead of spinning). Per layout: the update's median seconds over ``--updates`` updates and the
generator's tokens per second over the same time. docs/performance.md, *Threads on a shared CPU*, has a run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

from strata.models.prompts import PromptFormat
from strata_tools.stack.spec import cores_here
from strata_tools.train_stream import TrainOptions, prompt_rounds
from strata_tools.zoo.build import ZooSettings, ensure_zoo
from svc_learner.policy import PolicyWithValueHead
from svc_learner.ppo import PPOConfig, collate_rollouts, ppo_update

BATCH_PROMPTS = 16
SAMPLES_PER_PROMPT = 2
GENERATE_BATCH = 8
NEW_TOKENS = 64


def _side(spec: str) -> tuple[int, dict[str, str]]:
    """``"2"`` or ``"2p"`` -> (threads, the environment that runs them)."""
    passive = spec.endswith("p")
    threads = int(spec.rstrip("p"))
    env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    return threads, env | ({"OMP_WAIT_POLICY": "PASSIVE"} if passive else {})


def make_batch(policy_dir: Path, out: Path, seed: int) -> None:
    """The policy's own answers to the training stream's first prompts, as the live stack prompts it."""
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    prompt_format = PromptFormat.of(tokenizer)
    model = AutoModelForCausalLM.from_pretrained(policy_dir).eval()
    prompts = [r.text for r in next(prompt_rounds(TrainOptions(prompts_per_round=BATCH_PROMPTS, seed=seed)))]
    rows: dict[str, list] = {"prompts": [], "responses": []}
    for prompt in prompts[:BATCH_PROMPTS]:
        ids = tokenizer(prompt_format.generator_text(prompt, ()), return_tensors="pt").input_ids
        with torch.no_grad():
            out_ids = model.generate(ids.repeat(SAMPLES_PER_PROMPT, 1), do_sample=True, max_new_tokens=NEW_TOKENS,
                                     attention_mask=torch.ones_like(ids).repeat(SAMPLES_PER_PROMPT, 1),
                                     pad_token_id=tokenizer.pad_token_id)
        for row in out_ids:
            rows["prompts"].append(ids[0].tolist())
            rows["responses"].append([t for t in row[ids.shape[1]:].tolist() if t != tokenizer.pad_token_id] or [0])
    rows["scores"] = torch.rand(len(rows["prompts"]), generator=torch.Generator().manual_seed(seed)).mul(5).tolist()
    rows["pad"] = tokenizer.pad_token_id
    out.write_text(json.dumps(rows))


def learn(policy_dir: Path, batch_file: Path, updates: int, ready: Path | None, go: Path | None) -> list[float]:
    """PPO updates on the batch (after one warm-up update); seconds of each."""
    rows = json.loads(batch_file.read_text())
    batch = collate_rollouts(rows["prompts"], rows["responses"], rows["scores"], rows["pad"])
    policy = PolicyWithValueHead.from_pretrained(policy_dir)
    reference = policy.reference_copy()
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-5, eps=1e-5)
    config = PPOConfig()
    ppo_update(policy, reference, optimizer, batch, config, 0)
    if ready is not None and go is not None:
        ready.touch()
        while not go.exists():  # the generator is loaded and generating: start together
            time.sleep(0.05)
    seconds = []
    for index in range(1, updates + 1):
        started = time.perf_counter()
        ppo_update(policy, reference, optimizer, batch, config, index)
        seconds.append(time.perf_counter() - started)
    return seconds


def generate(policy_dir: Path, batch_file: Path, ready: Path, go: Path, done: Path) -> None:
    """Generate until the learner is done; prints tokens per second over the learner's updates."""
    rows = json.loads(batch_file.read_text())
    model = AutoModelForCausalLM.from_pretrained(policy_dir).eval()
    ids = torch.tensor([rows["prompts"][0]] * GENERATE_BATCH)
    tokens, started = 0, None
    while not done.exists():
        if started is None and ready.exists():
            go.touch()
            tokens, started = 0, time.perf_counter()
        with torch.no_grad():
            model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, max_new_tokens=NEW_TOKENS,
                           min_new_tokens=NEW_TOKENS, pad_token_id=rows["pad"])
        tokens += GENERATE_BATCH * NEW_TOKENS
    elapsed = time.perf_counter() - started if started is not None else float("nan")
    print(json.dumps({"tokens_per_second": tokens / elapsed}))


def run_layout(layout: str, policy_dir: Path, batch_file: Path, updates: int, scratch: Path) -> str:
    me = [sys.executable, __file__, "--policy-dir", str(policy_dir), "--batch-file", str(batch_file),
          "--updates", str(updates)]
    learner_spec, _, generator_spec = layout.partition("+")
    learner_threads, learner_env = _side(learner_spec)
    if not generator_spec:
        out = subprocess.run([*me, "--role", "learn"], env=os.environ | learner_env, check=True,
                             capture_output=True, text=True).stdout
        seconds = json.loads(out.strip().splitlines()[-1])["seconds"]
        return f"{layout:>6}: update {statistics.median(seconds):.2f} s alone at {learner_threads} thread(s)"
    generator_threads, generator_env = _side(generator_spec)
    ready, go, done = (scratch / f"{layout}.{name}" for name in ("ready", "go", "done"))
    flags = ["--ready", str(ready), "--go", str(go), "--done", str(done)]
    generator = subprocess.Popen([*me, "--role", "generate", *flags], env=os.environ | generator_env,
                                 stdout=subprocess.PIPE, text=True)
    try:
        out = subprocess.run([*me, "--role", "learn", *flags], env=os.environ | learner_env, check=True,
                             capture_output=True, text=True).stdout
    finally:
        done.touch()
        generated, _ = generator.communicate(timeout=300)
    seconds = json.loads(out.strip().splitlines()[-1])["seconds"]
    rate = json.loads(generated.strip().splitlines()[-1])["tokens_per_second"]
    return (f"{layout:>6}: update {statistics.median(seconds):.2f} s at {learner_threads} thread(s) beside "
            f"generation at {generator_threads}: {rate:.0f} tokens/s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layouts", default="1,2,1+1,2+2,2+1,2p+1")
    parser.add_argument("--updates", type=int, default=3, help="timed updates per layout (after a warm-up one)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--role", choices=("learn", "generate"), help=argparse.SUPPRESS)
    parser.add_argument("--policy-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--batch-file", type=Path, help=argparse.SUPPRESS)
    for name in ("ready", "go", "done"):
        parser.add_argument(f"--{name}", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    hf_logging.disable_progress_bar()  # a model loads per process and layout
    if args.role == "learn":
        print(json.dumps({"seconds": learn(args.policy_dir, args.batch_file, args.updates, args.ready, args.go)}))
        return 0
    if args.role == "generate":
        generate(args.policy_dir, args.batch_file, args.ready, args.go, args.done)
        return 0

    zoo = ensure_zoo(ZooSettings(), progress=False)
    with tempfile.TemporaryDirectory(prefix="strata-threads-") as tmp:
        scratch = Path(tmp)
        batch_file = scratch / "batch.json"
        make_batch(zoo.policy, batch_file, args.seed)
        rows = json.loads(batch_file.read_text())
        mean_response = statistics.fmean(len(r) for r in rows["responses"])
        print(f"zoo {zoo.config.config_hash()}, {cores_here()} cores: PPO updates on {len(rows['responses'])} "
              f"answers (mean {mean_response:.0f} response tokens), {args.updates} timed per layout", flush=True)
        for layout in args.layouts.split(","):
            print(run_layout(layout, zoo.policy, batch_file, args.updates, scratch), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
