"""A stand-in service for the supervisor tests: serves gRPC health, hangs or chatters on demand.

``python -m supervised_child --grpc-port PORT [--hang-file PATH] [--chatter-bytes-per-s N]``
(run with this directory on PYTHONPATH). It reports NOT_SERVING once ``--hang-file`` holds its
pid (a restarted child has another pid, so it serves again), and writes numbered lines to stdout
at the given rate. SIGTERM stops it after one last ``stopped`` line.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from strata import rpc

LINE_BYTES = 100
TICK_S = 0.005


def _hang_requested(hang_file: Path | None) -> bool:
    try:
        return hang_file is not None and hang_file.read_text().strip() == str(os.getpid())
    except FileNotFoundError:
        return False


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--hang-file", type=Path)
    parser.add_argument("--chatter-bytes-per-s", type=int, default=0)
    args = parser.parse_args()
    stopping: list[int] = []  # a plain flag: an Event set from a signal handler can deadlock on its own lock
    signal.signal(signal.SIGTERM, lambda signum, _frame: stopping.append(signum))
    running = rpc.start_server([], args.grpc_port)
    lines_per_tick = args.chatter_bytes_per_s * TICK_S / LINE_BYTES
    owed, seq = 0.0, 0
    while not stopping:
        if _hang_requested(args.hang_file):
            running.set_serving(False)
        owed += lines_per_tick
        while owed >= 1:
            sys.stdout.write(f"line {seq:08d} ".ljust(LINE_BYTES - 1, "x") + "\n")
            seq, owed = seq + 1, owed - 1
        sys.stdout.flush()
        time.sleep(TICK_S)
    print("stopped", flush=True)
    running.stop(0.5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
