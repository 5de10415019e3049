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

Prints the best and median wall time of each over --iters runs (after one
warm-up) and the ratios; a benchmark measures, it asserts nothing.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import gradcomp
from gradcomp.shm import ShmRegion
from gradcomp.testing import Daemon


def _timed(fn, iters: int) -> list[float]:
    fn()  # warm-up: first-touch page faults, channel set-up
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


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

        rows = [("inline bytes", _timed(inline, args.iters)),
                ("shm, in place", _timed(shm_in_place, args.iters)),
                ("shm, copy in/out", _timed(shm_copy, args.iters))]
        np.testing.assert_array_equal(result, grad)  # the shm path really ran
        client.unregister_shm()
        del source, target

    base = min(rows[0][1])
    print(f"{numel * 4 / 1e6:.0f} MB float32, codec none, world size 1, "
          f"{args.iters} runs each")
    print(f"{'path':<18} {'best s':>8} {'median s':>9} {'inline/this (best)':>19}")
    for name, times in rows:
        print(f"{name:<18} {min(times):8.4f} {statistics.median(times):9.4f} "
              f"{base / min(times):19.2f}")


if __name__ == "__main__":
    main()
