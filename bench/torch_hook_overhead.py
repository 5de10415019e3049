"""Step time of gradcomp.torch.hook against PyTorch's powerSGD_hook.

    PYTHONPATH=client/python GRADCOMPD=bazel-bin/service/gradcompd \
        /usr/bin/python3 bench/torch_hook_overhead.py [--workers 2] [--repeats 3]

Trains the Fashion-MNIST CNN of examples/fashion_mnist/train.py (the same
model, data, seed and steps for every configuration) with: DDP's own Gloo
allreduce, PyTorch's powerSGD_hook rank 2, gradcomp.torch.hook with powersgd
rank 2 and with none (one gradcompd per worker, peered over loopback). The
configurations run interleaved, `--repeats` rounds, and each reports its
mean step time (forward, backward, gradient exchange, update; first 10 steps
left out) and its CPU time per step (rank 0's process, all threads, and
its daemon's, both within the steps alone, the first 10 included, divided
by the steps); the table gives the medians over
the rounds and the ratios to
powerSGD_hook. Prints a markdown table. CPU time is the steadier figure on
a shared machine: other load stretches wall time but not our CPU seconds.
"""
from __future__ import annotations

import argparse
import pathlib
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "examples" / "fashion_mnist"))
import train  # noqa: E402  (the example is not a package)

CONFIGS = [
    ("DDP Gloo allreduce (dense)", dict(comm="ddp")),
    ("PyTorch powerSGD_hook rank 2", dict(comm="torch_powersgd")),
    ("gradcomp hook, powersgd rank 2", dict(policy=train.codec_policy("powersgd", {"rank": 2}))),
    ("gradcomp hook, none", dict(policy=train.codec_policy("none"))),
]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--train_limit", type=int, default=32000)
    args = p.parse_args()
    times: dict[str, list[float]] = {label: [] for label, _ in CONFIGS}
    cpu: dict[str, list[float]] = {label: [] for label, _ in CONFIGS}
    sent: dict[str, float] = {}
    for r in range(args.repeats):
        for label, overrides in CONFIGS:
            spec = train.RunSpec(workers=args.workers, epochs=1,
                                 train_limit=args.train_limit, test_limit=1000,
                                 **overrides)
            result = train.run(spec)
            times[label].append(result.step_seconds)
            cpu[label].append(result.cpu_seconds_per_step)
            sent[label] = result.bytes_per_step
            print(f"round {r + 1} {label}: {1000 * result.step_seconds:.1f} ms/step, "
                  f"{1000 * result.cpu_seconds_per_step:.1f} ms CPU/step",
                  file=sys.stderr, flush=True)
    base = statistics.median(times[CONFIGS[1][0]])
    base_cpu = statistics.median(cpu[CONFIGS[1][0]])
    print(f"W = {args.workers}, {args.repeats} rounds, steps per run: "
          f"{args.train_limit // (64 * args.workers)}")
    print()
    print("| configuration | step time (ms, median) | rounds (ms) | vs powerSGD_hook "
          "| CPU per step (ms, median) | CPU vs powerSGD_hook | bytes sent per step (KiB) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for label, _ in CONFIGS:
        median = statistics.median(times[label])
        median_cpu = statistics.median(cpu[label])
        rounds = ", ".join(f"{1000 * t:.1f}" for t in times[label])
        print(f"| {label} | {1000 * median:.1f} | {rounds} | {median / base:.2f}x | "
              f"{1000 * median_cpu:.1f} | {median_cpu / base_cpu:.2f}x | "
              f"{sent[label] / 1024:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
