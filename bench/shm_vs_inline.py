"""Shared memory vs inline bytes: one large tensor through a real gradcompd.

    bazel build //service:gradcompd
    PYTHONPATH=client/python /usr/bin/python3 bench/shm_vs_inline.py [--mb 100] [--iters 10]

Starts its own daemon (world size 1, --allow_client_shm) and reduces one
float32 tensor of --mb MB with the `none` codec, so that what differs is only
how the bytes travel between the trainer and the daemon:

- inline: Client.reduce(array): the request and the response carry the
  tensor (serialise, copy through gRPC, parse, and back).
- shm, in place: Client.reduce_shm() on a tensor that already lives in a
  registered region (a trainer whose buckets are allocated there); the
  daemon reads and writes the mapping.
- shm, copy in/out: the same, plus copying the trainer's array into the
  region and the result out of it (a trainer with its own buffers).

Prints, for each path over --iters runs (after one warm-up), the best and
median wall time and the median CPU time of the client and the daemon
together (user + system, all threads), and the inline/this ratios of both.
CPU time is the steadier figure on a shared machine: other load stretches
wall time, but not the cycles the two processes spend. A benchmark
measures; it asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

import gradcomp
from gradcomp.shm import ShmRegion
from gradcomp.testing import Daemon


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid`, all its threads."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _timed(fn, iters: int, daemon_pid: int) -> tuple[list[float], list[float]]:
    """Wall seconds and client + daemon CPU seconds of each call."""
    fn()  # warm-up: first-touch page faults, channel set-up
    wall, cpu = [], []
    for _ in range(iters):
        cpu0 = time.process_time() + _cpu_seconds(daemon_pid)
        start = time.perf_counter()
        fn()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() + _cpu_seconds(daemon_pid) - cpu0)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=100.0,
                        help="tensor size in MB (10^6 bytes) of float32")
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args()
    numel = int(args.mb * 1e6) // 4
    grad = np.random.default_rng(0).standard_normal(numel, dtype=np.float32)

    with Daemon(["--allow_client_shm"]) as daemon, \
            gradcomp.Client(daemon.target, timeout=600) as client, \
            ShmRegion(2 * grad.nbytes, tag="bench") as region:
        client.register_shm("bench", region)
        source = region.array(numel)
        target = region.array(numel, offset=grad.nbytes)
        source[...] = grad
        src, dst = region.tensor("bench", source), region.tensor("bench", target)
        result = np.empty_like(grad)
        step = iter(range(10**9))

        def inline():
            client.reduce(grad, "w", next(step), codec="none")

        def shm_in_place():
            client.reduce_shm("w", next(step), src, dst, codec="none")

        def shm_copy():
            source[...] = grad
            client.reduce_shm("w", next(step), src, dst, codec="none")
            result[...] = target

        pid = daemon.process.pid
        rows = [("inline bytes", *_timed(inline, args.iters, pid)),
                ("shm, in place", *_timed(shm_in_place, args.iters, pid)),
                ("shm, copy in/out", *_timed(shm_copy, args.iters, pid))]
        np.testing.assert_array_equal(result, grad)  # the shm path really ran
        client.unregister_shm()
        del source, target

    base_wall = min(rows[0][1])
    base_cpu = statistics.median(rows[0][2])
    print(f"{numel * 4 / 1e6:.0f} MB float32, codec none, world size 1, "
          f"{args.iters} runs each; load average {os.getloadavg()[0]:.1f}")
    print(f"| path | wall s (best) | wall s (median) | CPU s (median) | "
          f"inline/this, wall | inline/this, CPU |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, wall, cpu in rows:
        print(f"| {name} | {min(wall):.3f} | {statistics.median(wall):.3f} | "
              f"{statistics.median(cpu):.3f} | {base_wall / min(wall):.2f}x | "
              f"{base_cpu / statistics.median(cpu):.2f}x |")


if __name__ == "__main__":
    main()
