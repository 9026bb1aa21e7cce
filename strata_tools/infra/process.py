"""Small process utilities for the local infrastructure: pid files, ports, tools, waiting."""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Collection
from pathlib import Path


class InfraError(Exception):
    """Something the user must fix to bring the infrastructure up (printed without traceback)."""


def port_open(host: str, port: int, timeout_s: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def free_port(host: str = "127.0.0.1", avoid: Collection[int] = ()) -> int:
    """A port nothing listens on right now (the OS picks it), and not one of ``avoid``: ports handed
    to processes that have not bound them yet, which the OS may hand out again."""
    while True:
        with socket.socket() as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if port not in avoid:
            return port


def read_pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def process_cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def owned_pid(pid_file: Path, marker: str) -> int | None:
    """The pid in ``pid_file`` if that process is alive and its command line contains ``marker``.

    The marker check keeps ``down`` from signalling an unrelated process that reused the pid.
    """
    pid = read_pid(pid_file)
    if pid is None:
        return None
    cmdline = process_cmdline(pid)
    if not cmdline or marker not in cmdline:
        return None
    # A zombie (exited, not yet reaped by its parent) is not running.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None
    return None if state == "Z" else pid


def start_detached(argv: list[str], log_file: Path, pid_file: Path, env: dict[str, str] | None = None) -> int:
    """Start ``argv`` in its own session (it outlives the CLI), output appended to ``log_file``."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as out:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, env=env, close_fds=True,
        )
    pid_file.write_text(f"{proc.pid}\n")
    return proc.pid


def stop_pid(pid: int, timeout_s: float) -> bool:
    """SIGTERM, wait up to ``timeout_s``, then SIGKILL. True when it stopped gracefully."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not process_alive(pid):
            return True
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return True
    return False


def kill_pid(pid: int, timeout_s: float = 10.0) -> None:
    """SIGKILL, as a crash or a lost host would stop it, and wait until it is gone."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while process_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def halt(pid: int, pid_file: Path, timeout_s: float, kill: bool = False) -> str:
    """Stop a process this state dir started and drop its pid file; returns how it went, for the log.
    ``kill``: SIGKILL at once, as a crash or a lost host would; else SIGTERM and the grace period."""
    if kill:
        kill_pid(pid)
        how = "killed"
    else:
        how = "stopped" if stop_pid(pid, timeout_s) else "stopped with SIGKILL after the grace period"
    pid_file.unlink(missing_ok=True)
    return how


_HANDED_OUT_BLOCKS: set[int] = set()


def ephemeral_port_range() -> tuple[int, int]:
    """The range the kernel draws outgoing connections' local ports from (Linux's default if unread)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port_block(count: int, host: str = "127.0.0.1", attempts: int = 200) -> int:
    """The first of ``count`` consecutive ports that nothing listens on right now.

    Drawn below the kernel's ephemeral range: a block inside it can lose a port to any outgoing
    connection (the first broker's own clients) before the last node binds it. Blocks handed out
    earlier in this process are avoided too, since their owners may not have bound them yet."""
    low, _ = ephemeral_port_range()
    first, last = 10000, max(10000 + count, low - count)
    rng = random.Random()
    for _ in range(attempts):
        base = rng.randrange(first, last)
        block = set(range(base, base + count))
        if block & _HANDED_OUT_BLOCKS:
            continue
        if all(_bindable(host, port) for port in block):
            _HANDED_OUT_BLOCKS.update(block)
            return base
    raise InfraError(f"found no {count} consecutive free ports on {host} below {low}")


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
            return True
        except OSError:
            return False


def process_alive(pid: int) -> bool:
    """True while ``pid`` runs (zombies and reaped children count as gone)."""
    try:
        # Reap it if it is our child (a CLI that started and stops in one process, e.g. tests).
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    except ChildProcessError:
        pass
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of a process so far (/proc/<pid>/stat); 0 when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2:].split()  # after "(comm)", which may hold spaces: state is fields[0]
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _status_field(pid: int, name: str) -> int:
    """An integer field of /proc/<pid>/status (its first number); 0 when the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{name}:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def rss_bytes(pid: int) -> int:
    """Resident set size of a process (VmRSS, kB in /proc/<pid>/status); 0 when it is gone."""
    return _status_field(pid, "VmRSS") * 1024


def peak_rss_bytes(pid: int) -> int:
    """Peak resident set size of a process (VmHWM, kB in /proc/<pid>/status); 0 when it is gone."""
    return _status_field(pid, "VmHWM") * 1024


def thread_count(pid: int) -> int:
    """Threads of a process; 0 when it is gone."""
    return _status_field(pid, "Threads")


def open_fds(pid: int) -> int:
    """File descriptors a process holds open (sockets included); 0 when it is gone."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def wait_until(check: Callable[[], bool], timeout_s: float, what: str,
               abort: Callable[[], str | None] | None = None, interval_s: float = 0.25) -> None:
    """Poll ``check`` until true; ``abort`` returns a reason to give up early (process died)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if check():
            return
        if abort is not None and (reason := abort()):
            raise InfraError(f"{what}: {reason}")
        if time.monotonic() > deadline:
            raise InfraError(f"{what}: not ready after {timeout_s:.0f} s")
        time.sleep(interval_s)


def wait_serving(pid: int, what: str, process: str, log_file: Path, ready: Callable[[], bool],
                 timeout_s: float) -> None:
    """Until ``ready``; gives up at once, with the last lines of ``log_file``, if ``pid`` exits first."""

    def died() -> str | None:
        if not process_alive(pid):
            return f"{process} exited. Last lines of {log_file}:\n{tail(log_file)}"
        return None

    wait_until(ready, timeout_s, what, abort=died)


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def ensure_tool(binary: str, apt_package: str, purpose: str, hint: str) -> str:
    """Path of ``binary``; installs ``apt_package`` when missing and running as root with apt."""
    found = shutil.which(binary)
    if found:
        return found
    if os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "--no-install-recommends", apt_package]
        if subprocess.run(install, env=env, capture_output=True).returncode != 0:
            subprocess.run(["apt-get", "update"], env=env, capture_output=True)
            result = subprocess.run(install, env=env, capture_output=True, text=True)
            if result.returncode != 0:
                raise InfraError(f"{binary} is missing and `apt-get install {apt_package}` failed:\n"
                                 f"{result.stderr[-800:]}")
        found = shutil.which(binary)
        if found:
            return found
    raise InfraError(f"{binary} not found ({purpose}). {hint}")
