"""``make compose-test``: compose.yaml for real, on the CPU, with podman and docker-compose.

Runs ``compose.yaml`` itself with ``compose.cpu.yaml`` (no GPU requested; the ci zoo's tiny models):

1. podman's Docker API and the images (``deploy/podman/setup.sh``, ``deploy/images/build.sh``);
2. the models volume seeded with the ci zoo built on the host (``strata-init`` then checks it and
   writes its manifest in ~10 s instead of building for minutes; ``--fresh-zoo`` builds it inside);
3. ``docker-compose up -d``, then every healthcheck (Kafka, Redis, six services) healthy and
   ``strata-init`` exited 0;
4. prompts from outside the containers: ``strata submit`` to the published scheduler port (polite,
   long and plain prompts) and grpcurl from the .proto files; every accepted prompt's final
   rewards, and a ``PolicyUpdated`` from the learner;
5. ``--scale svc_generator_l1=2``: both replicas assigned partitions and rolling out; one replica
   stopped (``docker stop``, SIGTERM) while a stream is in flight, and every prompt still served;
6. ``docker-compose down -v``. A failed run keeps every container's log under ``.compose/logs/``.

Podman runs healthchecks from systemd timers; on hosts without systemd this script runs them
(``podman healthcheck run``) every few seconds instead, which is what compose's ``depends_on:
service_healthy`` waits on. Last line:
``compose services_healthy=<n>/<n> prompts=<p> finals=<p> scaled_replicas=2 lost=0``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROJECT = "strata-ci"
FILES = ("compose.yaml", "compose.cpu.yaml")
HEALTHY = ("kafka", "redis", "svc_scheduler", "svc_probe", "svc_generator_l1", "svc_generator_l2", "svc_reward",
           "svc_learner", "svc_annotation", "strata-exporter")
MODEL_UID = 10001  # the Strata image's user (Dockerfile)
LOGS = ROOT / ".compose" / "logs"
PROMPTS = [
    "Could you please explain how a hash table handles collisions? Thank you so much!",
    "Write a short Python function that reverses a string.",
    "Hi! I'm new to cooking. Would you kindly walk me through baking a simple loaf of bread, step by step? "
    "I have flour, yeast, salt and water, an oven that runs a little hot, and about three hours this "
    "afternoon. I'd love to understand why each step matters, not only what to do. Thanks in advance!",
    "Compare tea and coffee for someone who wants to sleep better.",
    "Summarise the causes of the French Revolution in three sentences.",
    "please help me plan a weekend trip to the mountains on a budget",
    "What is the difference between a list and a tuple in Python?",
    "Explain recursion to a ten-year-old.",
]


def log(message: str) -> None:
    print(f"== [{time.strftime('%H:%M:%S')}] {message}", flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Compose:
    """docker-compose on this project and the two files, against podman's Docker API."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env

    def run(self, *args: str, check: bool = True, capture: bool = False,
            timeout: float | None = None) -> subprocess.CompletedProcess[str]:
        argv = ["docker-compose", "-p", PROJECT, *(w for f in FILES for w in ("-f", str(ROOT / f))), *args]
        done = subprocess.run(argv, env=self.env, cwd=ROOT, text=True, timeout=timeout,
                              capture_output=capture)
        if check and done.returncode != 0:
            detail = (done.stderr or "")[-2000:] if capture else ""
            raise SystemExit(f"compose_check: `docker-compose {' '.join(args)}` failed ({done.returncode}) {detail}")
        return done


def podman(*args: str, check: bool = True) -> str:
    done = subprocess.run(["podman", *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise SystemExit(f"compose_check: podman {' '.join(args)} failed: {done.stderr.strip()[-1000:]}")
    return done.stdout


def containers() -> list[dict[str, str]]:
    """This project's containers: name, service, state, health."""
    rows = json.loads(podman("ps", "-a", "--filter", f"label=com.docker.compose.project={PROJECT}",
                             "--format", "json") or "[]")
    out = []
    for row in rows:
        labels = row.get("Labels") or {}
        name = row["Names"][0] if isinstance(row.get("Names"), list) else row.get("Names", "")
        health = podman("inspect", "--format", "{{.State.Health.Status}}", name, check=False).strip()
        out.append({"name": name, "service": labels.get("com.docker.compose.service", ""),
                    "state": row.get("State", ""), "health": health, "exit": str(row.get("ExitCode", ""))})
    return out


class HealthPump:
    """Runs each container's healthcheck every few seconds (podman leaves it to systemd timers)."""

    def __init__(self, every_s: float = 5.0) -> None:
        self.every_s = every_s
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="health-pump", daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            for container in containers():
                if container["state"] == "running" and container["health"] not in ("", "<no value>"):
                    subprocess.run(["podman", "healthcheck", "run", container["name"]], capture_output=True)
            self.stop.wait(self.every_s)

    def __enter__(self) -> HealthPump:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=60)


def wait_for(what: str, check: Callable[[], str | None], timeout_s: float, every_s: float = 3.0) -> None:
    """Until ``check`` returns None; it returns what is still missing, printed as progress."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while (missing := check()) is not None:
        if time.monotonic() > deadline:
            raise SystemExit(f"compose_check: {what}: not done after {timeout_s:.0f} s: {missing}")
        if missing != last:
            log(f"{what}: waiting for {missing}")
            last = missing
        time.sleep(every_s)  # polling another process's state; nothing to wait on directly


def unhealthy(expected: Sequence[str], replicas: dict[str, int] | None = None) -> str | None:
    state = containers()
    init = [c for c in state if c["service"] == "strata-init"]
    if init and init[0]["state"] == "exited" and init[0]["exit"] not in ("0", ""):
        raise SystemExit(f"compose_check: strata-init exited with {init[0]['exit']}")
    missing = []
    for service in expected:
        want = (replicas or {}).get(service, 1)
        healthy = [c for c in state if c["service"] == service and c["health"] == "healthy"]
        if len(healthy) < want:
            have = ", ".join(f"{c['state']}/{c['health'] or '-'}" for c in state if c["service"] == service)
            missing.append(f"{service} ({have or 'not created'})")
        for c in state:
            if c["service"] == service and c["state"] == "exited":
                raise SystemExit(f"compose_check: {c['name']} exited with {c['exit']}")
    if not init or init[0]["state"] != "exited":
        missing.append("strata-init to finish")
    return ", ".join(missing) or None


def seed_models(fresh: bool) -> None:
    """The models volume, holding the host's ci zoo (``strata-init`` verifies it and writes the manifest)."""
    volume = f"{PROJECT}_models"
    podman("volume", "rm", "-f", volume, check=False)
    podman("volume", "create", "--label", f"com.docker.compose.project={PROJECT}",
           "--label", "com.docker.compose.volume=models", volume)
    mountpoint = Path(podman("volume", "inspect", "--format", "{{.Mountpoint}}", volume).strip())
    if not fresh:
        from strata_tools.zoo.build import ZooSettings, ensure_zoo

        zoo = ensure_zoo(ZooSettings(zoo_preset="ci"))
        target = mountpoint / "zoo" / zoo.root.name
        log(f"models volume: the host's ci zoo {zoo.root.name} -> {volume}")
        shutil.copytree(zoo.root, target)
    subprocess.run(["chown", "-R", f"{MODEL_UID}:{MODEL_UID}", str(mountpoint)], check=True)


def submit(address: str, prompts: Sequence[str], timeout_s: float, wait: bool = True) -> subprocess.Popen[str]:
    """``strata submit`` from the host: one JSON line per prompt, final rewards awaited."""
    path = LOGS.parent / f"prompts-{time.monotonic_ns()}.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    argv = [str(ROOT / ".venv" / "bin" / "strata"), "submit", "--file", str(path), "--address", address,
            "--timeout", str(timeout_s)]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if wait:
        process.wait()
    return process


def finals_of(output: str) -> tuple[int, int]:
    """(prompts accepted, prompts with final rewards) from ``strata submit``'s output."""
    accepted = sum(" decision=" in line for line in output.splitlines())
    finals = sum("final_reward=" in line for line in output.splitlines())
    return accepted, finals


def grpcurl(address: str) -> str:
    """List the scheduler's services and submit one prompt, from the .proto files (compose turns
    server reflection off)."""
    installed = subprocess.run([str(ROOT / "scripts" / "install-grpcurl")], capture_output=True, text=True)
    if installed.returncode != 0:
        raise SystemExit(f"compose_check: grpcurl could not be installed: {installed.stderr.strip()}")
    binary = installed.stdout.strip().splitlines()[-1]
    protos = ["-import-path", str(ROOT / "protos"), "-proto", "strata/v1/scheduler.proto"]
    listed = subprocess.run([binary, "-plaintext", *protos, address, "list"], capture_output=True, text=True,
                            check=True)
    if "strata.v1.Scheduler" not in listed.stdout:
        raise SystemExit(f"compose_check: grpcurl list did not show strata.v1.Scheduler: {listed.stdout}")
    request = json.dumps({"prompt": "Thanks in advance: how do I boil an egg?", "nSamples": 1})
    called = subprocess.run([binary, "-plaintext", *protos, "-d", request, address, "strata.v1.Scheduler/Submit"],
                            capture_output=True, text=True, check=True)
    reply = json.loads(called.stdout)
    prompt_hash = reply.get("promptHash") or reply.get("prompt_hash")  # grpcurl versions differ
    if not re.fullmatch(r"[0-9a-f]{64}", str(prompt_hash)):
        raise SystemExit(f"compose_check: grpcurl Submit answered without a prompt hash: {called.stdout}")
    return str(prompt_hash)


def policy_updates(compose: Compose) -> int:
    """PolicyUpdated events on strata.policy.updated, read inside the network (Kafka is not published)."""
    script = ("from strata.bus.admin import events_retained; from strata.bus import topics; "
              "from strata.config import StrataSettings; "
              "print(events_retained(StrataSettings(), topics.POLICY_UPDATED))")
    done = compose.run("exec", "-T", "svc_scheduler", "python", "-c", script, capture=True, check=False)
    try:
        return int(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return 0


def rollouts_by(name: str) -> int:
    """Level-1 rollouts a generator replica has logged (services log to stderr)."""
    logs = subprocess.run(["podman", "logs", name], capture_output=True, text=True)
    return (logs.stdout + logs.stderr).count("rollout tier=1")


def keep_logs() -> None:
    LOGS.mkdir(parents=True, exist_ok=True)
    for container in containers():
        out = subprocess.run(["podman", "logs", container["name"]], capture_output=True, text=True)
        (LOGS / f"{container['name']}.log").write_text(out.stdout + out.stderr)
    log(f"logs of every container kept under {LOGS}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make compose-test", description=__doc__.splitlines()[0])
    parser.add_argument("--fresh-zoo", action="store_true", help="let strata-init build the ci zoo in its container")
    parser.add_argument("--keep", action="store_true", help="leave the stack up afterwards")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds for start-up and for each stream")
    args = parser.parse_args(argv)
    started = time.monotonic()
    shutil.rmtree(LOGS.parent, ignore_errors=True)
    LOGS.parent.mkdir(parents=True)

    setup = subprocess.run([str(ROOT / "deploy" / "podman" / "setup.sh")], capture_output=True, text=True)
    if setup.returncode != 0:
        raise SystemExit(f"compose_check: deploy/podman/setup.sh failed: {setup.stderr}")
    docker_host = setup.stdout.strip().splitlines()[-1].split("=", 1)[1]
    if subprocess.run([str(ROOT / "deploy" / "images" / "build.sh")]).returncode != 0:
        raise SystemExit("compose_check: deploy/images/build.sh failed (its output is above)")
    scheduler_port, prometheus_port = free_port(), free_port()
    env = {**os.environ, "DOCKER_HOST": docker_host, "STRATA_ZOO_PRESET": "ci",
           "STRATA_SCHEDULER_HOST_PORT": str(scheduler_port), "STRATA_PROMETHEUS_HOST_PORT": str(prometheus_port),
           "COMPOSE_HTTP_TIMEOUT": "300"}
    compose = Compose(env)
    address = f"127.0.0.1:{scheduler_port}"
    compose.run("down", "-v", "--remove-orphans", check=False, capture=True)
    seed_models(args.fresh_zoo)
    ok = False
    try:
        with HealthPump():
            log("docker-compose up -d")
            compose.run("up", "-d")
            wait_for("healthchecks", lambda: unhealthy(HEALTHY), args.timeout)
            healthy = sum(c["health"] == "healthy" for c in containers() if c["service"] in HEALTHY)
            log(f"{healthy}/{len(HEALTHY)} services healthy, strata-init done, "
                f"{time.monotonic() - started:.0f} s from the start")

            log(f"strata submit: {len(PROMPTS) * 2} prompts from the host to {address}")
            first = submit(address, PROMPTS * 2, args.timeout)
            output = first.stdout.read() if first.stdout else ""
            (LOGS.parent / "submit-1.txt").write_text(output)
            accepted, finals = finals_of(output)
            log(f"strata submit: {accepted} accepted, {finals} with final rewards (exit {first.returncode})")
            prompt_hash = grpcurl(address)
            log(f"grpcurl: listed strata.v1.Scheduler from the protos, submitted prompt {prompt_hash[:12]}")
            wait_for("a PolicyUpdated from the learner", lambda: None if policy_updates(compose) else "an update",
                     args.timeout, every_s=5.0)
            log(f"PolicyUpdated events: {policy_updates(compose)}")

            log("docker-compose up -d --no-deps --scale svc_generator_l1=2 svc_generator_l1")
            # Only the scaled service: a plain `up` also restarts the exited strata-init, and podman's runc
            # raced reading the cgroup of that instantly-exiting container ("read /proc/<pid>/cgroup: no
            # such process"), failing the step with nothing wrong in Strata.
            compose.run("up", "-d", "--no-recreate", "--no-deps", "--scale", "svc_generator_l1=2", "svc_generator_l1")
            wait_for("the second Level-1 replica", lambda: unhealthy(HEALTHY, {"svc_generator_l1": 2}), args.timeout)
            replicas = sorted(c["name"] for c in containers() if c["service"] == "svc_generator_l1")
            stream = [f"{p} (variant {i})" for i in range(12) for p in PROMPTS]
            log(f"strata submit: {len(stream)} more prompts; stopping {replicas[-1]} once both replicas roll out")
            before = {r: rollouts_by(r) for r in replicas}
            second = submit(address, stream, args.timeout, wait=False)

            def idle_replicas() -> str | None:
                idle = [r for r in replicas if rollouts_by(r) <= before[r]]
                return f"new rollouts on {', '.join(idle)}" if idle else None

            wait_for("both Level-1 replicas rolling out the stream", idle_replicas, args.timeout, every_s=1.0)
            during = {r: rollouts_by(r) - before[r] for r in replicas}
            log(f"Level-1 rollouts of this stream so far, by replica: {during}")
            podman("stop", "--time", "60", replicas[-1])  # SIGTERM: drain, commit, leave the group
            outstanding = "still running" if second.poll() is None else "already done"
            log(f"stopped {replicas[-1]} mid-stream (the submission was {outstanding} when it stopped)")
            output2, _ = second.communicate(timeout=args.timeout + 60)
            (LOGS.parent / "submit-2.txt").write_text(output2)
            accepted2, finals2 = finals_of(output2)
            log(f"strata submit: {accepted2} accepted, {finals2} with final rewards (exit {second.returncode})")
            prompts, served = accepted + accepted2, finals + finals2
            lost = prompts - served
            ok = lost == 0 and first.returncode == 0 and second.returncode == 0
            print(f"compose services_healthy={healthy}/{len(HEALTHY)} prompts={prompts} finals={served} "
                  f"scaled_replicas={len(replicas)} lost={lost}", flush=True)
    finally:
        if not ok:
            keep_logs()
        if not args.keep:
            compose.run("down", "-v", "--remove-orphans", check=False, capture=True)
        log(f"done in {time.monotonic() - started:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
