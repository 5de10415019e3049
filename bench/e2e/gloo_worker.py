"""One rank of the Gloo baseline: dense allreduce of the ResNet-50 gradient set.

Runs inside a host namespace of tests/e2e/shaped_net.py with
GLOO_SOCKET_IFNAME=eth0. The tensors are gradcomp.resnet50's (seed = rank),
as torch tensors. Each step does what DDP does with its default 25 MB
buckets (DDP's first bucket is 1 MiB, which changes the bucket count by one
and the bytes not at all): tensors are packed in reverse registration order
(DDP's bucket order) into flat fp32 buckets of at most 25 MiB, each bucket is allreduced
(SUM) and divided by the world size, and the averages are copied back into
the per-parameter tensors. The step time covers pack, allreduce, divide and
unpack; a dist.barrier() before each step (not timed) starts the ranks
together. Writes {"rank", "buckets", "bucket_bytes", "steps": [{"wall_s",
"qdisc_sent"}]} as JSON to --out.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import re
import subprocess
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from gradcomp import resnet50

BUCKET_BYTES = 25 * 1024 * 1024


def qdisc_sent() -> int:
    out = subprocess.run(["tc", "-s", "qdisc", "show", "dev", "eth0"], check=True,
                         text=True, capture_output=True).stdout
    return int(re.search(r"Sent (\d+) bytes", out).group(1))


def buckets_of(tensors: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    out: list[list[torch.Tensor]] = [[]]
    size = 0
    for t in reversed(tensors):
        nbytes = t.numel() * t.element_size()
        if out[-1] and size + nbytes > BUCKET_BYTES:
            out.append([])
            size = 0
        out[-1].append(t)
        size += nbytes
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world_size", type=int, default=4)
    p.add_argument("--master", required=True, help="host:port of rank 0's TCP store")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=f"tcp://{args.master}",
                            rank=args.rank, world_size=args.world_size,
                            timeout=timedelta(seconds=120))
    grads = [torch.from_numpy(g) for g in resnet50.synthetic_gradients(args.rank).values()]
    buckets = buckets_of(grads)
    flats = [torch.empty(sum(t.numel() for t in b)) for b in buckets]
    steps = []
    for step in range(args.steps):
        q0 = qdisc_sent()  # a `tc` run: before the barrier, as in tests/e2e/worker.py
        dist.barrier()
        t0 = time.perf_counter()
        # As DDP does: each bucket's allreduce starts as soon as the bucket is
        # packed, without waiting for the one before (Gloo runs them on its
        # own threads), and the averages are unpacked once all are done.
        works = []
        for bucket, flat in zip(buckets, flats):
            torch.cat([t.reshape(-1) for t in bucket], out=flat)
            works.append(dist.all_reduce(flat, async_op=True))
        for bucket, flat, work in zip(buckets, flats, works):
            work.wait()
            flat.div_(args.world_size)
            offset = 0
            for t in bucket:
                t.copy_(flat[offset:offset + t.numel()].view_as(t))
                offset += t.numel()
        wall = time.perf_counter() - t0
        dist.barrier()
        steps.append({"wall_s": wall, "qdisc_sent": qdisc_sent() - q0})
        print(f"gloo rank {args.rank} step {step}: {wall:.2f} s", flush=True)
    pathlib.Path(args.out).write_text(json.dumps({
        "rank": args.rank, "buckets": len(buckets),
        "bucket_bytes": [f.numel() * 4 for f in flats], "steps": steps}))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
