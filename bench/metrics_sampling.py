"""What the relative-error metric costs: step time with sampling on vs off.

Every sampled reduce decodes the worker's own payload once more to measure
||g - D(C(g))|| / ||g|| (and reads the error-feedback residual's norm). This
bench runs one gradcompd per --error_sample_rate (0, 0.1, 1, and a second 0
as a control; world size 1, so the collective costs nothing and the codec's
own time is all there is),
sends each the ResNet-50 synthetic gradient set (161 tensors, 25.6M floats)
as one ReduceStream per step, interleaving the daemons step by step so that
load from other processes falls on all of them alike, and prints per rate
the median step time (wall clock, as the client sees it) and the median CPU
time the daemon process spent on the step (user + system, from /proc: less
disturbed by other processes on a shared machine), each also as a ratio to
rate 0.

    bazel build //service:gradcompd && client/python/generate_protos.sh
    PYTHONPATH=client/python /usr/bin/python3 bench/metrics_sampling.py

Results: docs/benchmarks.md, "Metrics cost".
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

from gradcomp import resnet50
from gradcomp.client import Client
from gradcomp.testing import Daemon

# The second rate-0 daemon is an A/A control: how far two identical daemons
# differ on this machine bounds what the other rows can show.
RATES = (0.0, 0.1, 1.0, 0.0)
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
CODECS = {"topk 1%": ("topk", {"ratio": "0.01"}),
          "qsgd 4-bit": ("qsgd", {"bits": "4"})}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its threads so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=6, help="timed steps per rate and codec")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    args = p.parse_args()

    grads = resnet50.synthetic_gradients(seed=0)
    numel = sum(g.size for g in grads.values())
    print(f"# {len(grads)} tensors, {numel:,} floats; load average "
          f"{os.getloadavg()[0]:.2f} at start")
    daemons = [Daemon([f"--error_sample_rate={rate}"]).start() for rate in RATES]
    try:
        clients = [Client(d.target, timeout=600) for d in daemons]
        print("| codec | error_sample_rate | step, wall (s) | vs rate 0 "
              "| daemon CPU per step (s) | vs rate 0 |")
        print("| --- | --- | --- | --- | --- | --- |")
        for label, (codec, params) in CODECS.items():
            times: list[list[float]] = [[] for _ in RATES]
            cpu: list[list[float]] = [[] for _ in RATES]
            for step in range(args.warmup + args.steps):
                # Rotate who goes first, so no rate always follows another.
                for k in range(len(RATES)):
                    i = (k + step) % len(RATES)
                    pid = daemons[i].process.pid
                    start, start_cpu = time.perf_counter(), cpu_seconds(pid)
                    clients[i].reduce_many(grads, step=step, codec=codec,
                                           params=params, job=label)
                    if step >= args.warmup:
                        times[i].append(time.perf_counter() - start)
                        cpu[i].append(cpu_seconds(pid) - start_cpu)
            base = statistics.median(times[0])
            base_cpu = statistics.median(cpu[0])
            for k, (rate, wall, used) in enumerate(zip(RATES, times, cpu)):
                w, c = statistics.median(wall), statistics.median(used)
                name = f"{rate:g}" + (" (control)" if k > 0 and rate == RATES[0] else "")
                print(f"| {label} | {name} | {w:.3f} | {w / base:.3f} "
                      f"| {c:.3f} | {c / base_cpu:.3f} |")
        print(f"# load average {os.getloadavg()[0]:.2f} at the end")
        for client in clients:
            client.close()
    finally:
        for daemon in daemons:
            daemon.close()


if __name__ == "__main__":
    main()
