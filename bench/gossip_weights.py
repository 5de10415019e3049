"""Trained model weights for PowerGossip's consensus experiment (the
`weights` data of bench/gossip_consensus.cc; docs/gossip.md).

What the product gossips is models, so this is the data that matters most:
W copies of a small MLP (784 -> 56 -> 56 -> 10, ReLU) start from one common
initialisation (torch seed SEED, default 0) and each takes STEPS plain SGD steps on its own
disjoint shard of the Fashion-MNIST training set (worker i: the i-th of W
contiguous blocks of the first W * SHARD images). Each worker's fc2.weight,
a 56 x 56 matrix like the bench's other data, is written to OUT: the bytes
b"GCWT", then int32 W, rows, cols (little-endian), then W * rows * cols
float32, worker by worker, row-major. One thread and deterministic
algorithms: the same command writes the same bytes.

    /usr/bin/python3 bench/gossip_weights.py /tmp/gossip_consensus_weights.bin

It prints how much of the workers' differences from their mean lies in the
top r singular directions (the part a rank-r PowerGossip step can remove).
"""
import argparse
import gzip
import struct
import sys
from typing import List

import numpy as np
import torch

IMAGES = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"
LABELS = "/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz"
HIDDEN = 56


def read_idx(path: str, header: int) -> np.ndarray:
    try:
        with gzip.open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        sys.exit(f"{path} not found: expected the Debian package "
                 "dataset-fashion-mnist (tools/setup installs it)")
    return np.frombuffer(data, dtype=np.uint8, offset=header)


def mlp() -> torch.nn.Sequential:
    return torch.nn.Sequential(
        torch.nn.Linear(784, HIDDEN), torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, 10))


def train(workers: int, steps: int, batch: int, lr: float,
          seed: int) -> List[np.ndarray]:
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    images = torch.from_numpy(
        read_idx(IMAGES, 16).reshape(-1, 784).astype(np.float32) / 255.0)
    labels = torch.from_numpy(read_idx(LABELS, 8).astype(np.int64))
    shard = steps * batch
    if workers * shard > len(images):
        sys.exit(f"{workers} workers x {steps} steps x batch {batch} need "
                 f"{workers * shard} images; the training set has "
                 f"{len(images)}")
    init = mlp().state_dict()
    out = []
    for w in range(workers):
        net = mlp()
        net.load_state_dict(init)
        opt = torch.optim.SGD(net.parameters(), lr=lr)
        for s in range(steps):
            lo = w * shard + s * batch
            loss = torch.nn.functional.cross_entropy(
                net(images[lo:lo + batch]), labels[lo:lo + batch])
            opt.zero_grad()
            loss.backward()
            opt.step()
        out.append(net[2].weight.detach().numpy().astype(np.float32).copy())
    return out


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="file to write")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0,
                        help="torch seed of the common initialisation")
    args = parser.parse_args(argv[1:])
    xs = train(args.workers, args.steps, args.batch, args.lr, args.seed)
    rows, cols = xs[0].shape
    with open(args.out, "wb") as f:
        f.write(b"GCWT" + struct.pack("<3i", len(xs), rows, cols))
        for x in xs:
            f.write(x.astype("<f4").tobytes())
    diffs = np.stack(xs) - np.mean(xs, axis=0)
    energy = [np.linalg.svd(d, compute_uv=False) ** 2 for d in diffs]
    share = {r: np.mean([e[:r].sum() / e.sum() for e in energy])
             for r in (1, 2, 4, 8)}
    print(f"{args.out}: {len(xs)} workers' fc2.weight, {rows} x {cols}; "
          "mean share of a worker's difference from the mean in its top r "
          "singular directions: " +
          ", ".join(f"r = {r}: {s:.2f}" for r, s in share.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
