"""A short look at compressed data-parallel training, run by tools/demo.

    PYTHONPATH=client/python /usr/bin/python3 examples/fashion_mnist/quick.py

W workers (default 2), each with its own gradcompd peered with the others
on this machine, train the CNN of train.py for one epoch on a subset of
Fashion-MNIST; the rows are those of the convergence table (table.py) less
efsign and `none`, warmed up over the first quarter of the epoch (the
table warms up over its whole first epoch). Prints test accuracy, bytes
each worker sends per step and step time per row, and writes nothing. The
full comparison, with every row and more epochs, is run_table
(docs/convergence.md). --seed and --rows (e.g. powersgd,powerSGD) train
other seeds and a subset of the rows: one epoch varies a lot from seed to
seed (docs/convergence.md, "PowerSGD in the one-epoch demo").
"""
from __future__ import annotations

import argparse
import dataclasses
import sys

import table
import train

SKIPPED_ROWS = ("gradcomp efsign", "gradcomp none")


def demo_rows(warmup_steps: int, workers: int, train_limit: int,
              test_limit: int, seed: int = 0,
              words: list[str] | None = None) -> list[tuple[str, train.RunSpec]]:
    """(label, spec) of every row the demo trains: the convergence table's
    rows less SKIPPED_ROWS, their warm-up `warmup_steps` long, each for one
    epoch of `train_limit` images on `workers` workers with `seed`, tested
    on `test_limit` images; with `words`, only the rows whose label holds
    one of them."""
    return [(label, dataclasses.replace(spec, workers=workers, epochs=1,
                                        train_limit=train_limit,
                                        test_limit=test_limit, seed=seed))
            for label, spec, _ in table.rows(warmup_steps)
            if label not in SKIPPED_ROWS
            and (not words or any(w in label for w in words))]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--train_limit", type=int, default=12000)
    p.add_argument("--test_limit", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0,
                   help="the initial model, data order, the daemons' seed and "
                        "powerSGD_hook's random_seed, as in the table")
    p.add_argument("--rows", default="",
                   help="train only the rows whose label holds one of these "
                        "comma-separated words (e.g. 'powersgd,powerSGD')")
    args = p.parse_args()
    words = [w for w in args.rows.split(",") if w]
    base = train.RunSpec(workers=args.workers, epochs=1)
    steps = args.train_limit // (base.batch_size * args.workers)
    print(f"Fashion-MNIST, W = {args.workers} workers (each with its own "
          f"gradcompd for the gradcomp rows), 1 epoch of {args.train_limit} "
          f"images = {steps} steps, test on {args.test_limit} images")
    print(f"{'row':<30} {'accuracy':>9} {'KiB/step':>9} {'dense/this':>11} "
          f"{'step ms':>8}")
    # The table warms every compressing row up over its first epoch; the
    # demo trains one epoch, so it warms up over the first quarter and
    # compresses the rest.
    for label, spec in demo_rows(max(steps // 4, 1), args.workers,
                                 args.train_limit, args.test_limit, args.seed,
                                 words):
        result = train.run(spec)
        print(f"{label:<30} {100 * result.accuracy[-1]:>8.1f}% "
              f"{result.bytes_per_step / 1024:>9.1f} "
              f"{result.raw_bytes_per_step / result.bytes_per_step:>10.1f}x "
              f"{1000 * result.step_seconds:>8.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
