"""PowerSGD with and without batching of same-shape matrices, W daemons on
loopback.

    bazel build //service:gradcompd
    PYTHONPATH=client/python /usr/bin/python3 bench/batching_bench.py \\
        [--world 4] [--steps 3] [--workload resnet50 small]

Starts W peered gradcompd processes on 127.0.0.1 and, on one thread per
rank, reduces a whole model's gradients per step over one ReduceStream with
codec powersgd (rank --rank), once unbatched and once with the DDP hook's
batches (gradcomp.torch.same_shape_batches: matrices of equal shape and
dtype). Workloads: `resnet50`, torchvision ResNet-50's 161 tensors with
synthetic gradients (53 convolutions and the classifier as matrices, the
batch-norm vectors dense); `small`, 256 matrices of 32 x 32, where the
per-collective cost dominates. Prints collectives per step (from rank 0's
gradcomp_collective_duration_seconds counts) and the median step time over
--steps steps after one warm-up step, and the unbatched/batched ratios.
A benchmark measures; it asserts nothing.
"""
from __future__ import annotations

import argparse
import statistics
import threading
import time

import numpy as np

import gradcomp
from gradcomp import metrics, resnet50
from gradcomp.testing import Daemon, free_port
from gradcomp.torch import same_shape_batches


def _gradients(workload: str, rank: int) -> dict[str, np.ndarray]:
    if workload == "resnet50":
        return resnet50.synthetic_gradients(seed=rank)
    rng = np.random.default_rng(rank)
    return {f"small{i}.weight": rng.standard_normal((32, 32), dtype=np.float32)
            for i in range(256)}


def _collectives(daemon: Daemon) -> float:
    return metrics.total(metrics.scrape(daemon.metrics_url),
                         "gradcomp_collective_duration_seconds_count")


def _run(daemons: list[Daemon], workload: str, batched: bool, steps: int,
         rank: int) -> tuple[float, float]:
    """(collectives per step, median step seconds) of one configuration."""
    grads = [_gradients(workload, r) for r in range(len(daemons))]
    batches = (same_shape_batches((n, g.shape, g.dtype.str)
                                  for n, g in grads[0].items())
               if batched else None)
    job = f"{workload}-{'batched' if batched else 'plain'}"
    clients = [gradcomp.Client(d.target, timeout=600) for d in daemons]
    errors: list[BaseException] = []

    def step_on(r: int, step: int) -> None:
        try:
            clients[r].reduce_many(grads[r], step=step, job=job, codec="powersgd",
                                   params={"rank": rank}, batches=batches)
        except BaseException as error:  # reported by the caller
            errors.append(error)

    times = []
    before = 0.0
    for step in range(steps + 1):
        if step == 1:
            before = _collectives(daemons[0])
        start = time.perf_counter()
        threads = [threading.Thread(target=step_on, args=(r, step))
                   for r in range(len(daemons))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        if step >= 1:
            times.append(time.perf_counter() - start)
    per_step = (_collectives(daemons[0]) - before) / steps
    for client in clients:
        client.close()
    return per_step, statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rank", type=int, default=4, help="PowerSGD rank")
    parser.add_argument("--workload", nargs="+", default=["small", "resnet50"],
                        choices=["small", "resnet50"])
    args = parser.parse_args()

    peers = ",".join(f"127.0.0.1:{free_port()}" for _ in range(args.world))
    daemons = [Daemon([f"--rank={r}", f"--world_size={args.world}",
                       f"--peers={peers}"]) for r in range(args.world)]
    try:
        for daemon in daemons:
            daemon.start()
        print(f"W={args.world}, powersgd rank {args.rank}, median of "
              f"{args.steps} steps after one warm-up")
        print(f"{'workload':10} {'mode':8} {'collectives/step':>17} "
              f"{'step s':>8}")
        for workload in args.workload:
            plain = _run(daemons, workload, False, args.steps, args.rank)
            batched = _run(daemons, workload, True, args.steps, args.rank)
            for mode, (count, seconds) in (("plain", plain), ("batched", batched)):
                print(f"{workload:10} {mode:8} {count:17.0f} {seconds:8.3f}")
            print(f"{workload:10} {'ratio':8} {plain[0] / batched[0]:17.2f} "
                  f"{plain[1] / batched[1]:8.2f}   (plain / batched)")
    finally:
        for daemon in daemons:
            daemon.close()


if __name__ == "__main__":
    main()
