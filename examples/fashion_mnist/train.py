"""Data-parallel Fashion-MNIST training over gradcompd, one daemon per worker.

    PYTHONPATH=client/python /usr/bin/python3 examples/fashion_mnist/train.py \
        --comm=gradcomp --codec=topk --param=ratio=0.01 --workers=4 --epochs=3

W worker processes on this machine. Each starts its own gradcompd (peered
with the others: --rank --world_size --peers), sets up DDP on Gloo, and
hands its gradients to gradcomp.torch.hook. --comm=ddp trains with DDP's own
Gloo allreduce instead, --comm=torch_powersgd with PyTorch's powerSGD_hook:
the two baselines of the convergence table (run_table). --gossip=ring trains
decentralised through the hook's gossip mode (PowerGossip, or exact gossip
with --gossip_rank=0): the reported accuracy is then that of the workers'
averaged model (gossip_table.py).

Every worker reads the dataset that Debian's dataset-fashion-mnist package
installs (gzipped IDX), takes its 1/W share of a per-epoch permutation drawn
from the run's seed, and evaluates its 1/W share of the test set after each
epoch; the counts are summed over Gloo.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import gzip
import json
import math
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time
from typing import Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_powersgd

import gradcomp.torch
from gradcomp import metrics
from gradcomp.testing import daemon_binary, free_port, stop_process

DATA_DIR = pathlib.Path("/usr/share/datasets/fashion-mnist")

# Gloo's allreduce as imported, for evaluation: the torch_powersgd row wraps
# dist.all_reduce to count its hook's bytes.
_UNCOUNTED_ALL_REDUCE = dist.all_reduce

# The daemons' policy thresholds (the daemon's defaults, written out because
# the DGC row's optimizer must know which tensors the codec compresses).
DENSE_BELOW_NUMEL = 1024


def load_split(split: str, limit: int | None = None,
               data_dir: pathlib.Path = DATA_DIR) -> tuple[torch.Tensor, torch.Tensor]:
    """Images (N, 1, 28, 28) float32, standardised, and labels (N,) int64.

    `split` is "train" or "t10k"; `limit` keeps the first N examples.
    """
    images_path = data_dir / f"{split}-images-idx3-ubyte.gz"
    labels_path = data_dir / f"{split}-labels-idx1-ubyte.gz"
    if not images_path.exists():
        raise FileNotFoundError(f"no {images_path}: install Debian's "
                                f"dataset-fashion-mnist (tools/setup does)")
    with gzip.open(images_path, "rb") as f:
        raw = f.read()
    magic, n, rows, cols = np.frombuffer(raw, ">u4", 4)
    if magic != 0x803 or len(raw) != 16 + n * rows * cols:
        raise ValueError(f"{images_path}: expected an IDX ubyte image file "
                         f"(magic 0x803), got magic {magic:#x}, {len(raw)} bytes")
    images = np.frombuffer(raw, np.uint8, offset=16).reshape(n, 1, rows, cols)
    with gzip.open(labels_path, "rb") as f:
        raw = f.read()
    magic, m = np.frombuffer(raw, ">u4", 2)
    if magic != 0x801 or m != n or len(raw) != 8 + m:
        raise ValueError(f"{labels_path}: expected {n} IDX ubyte labels "
                         f"(magic 0x801), got magic {magic:#x}, {m} labels")
    labels = np.frombuffer(raw, np.uint8, offset=8)
    if limit is not None:
        images, labels = images[:limit], labels[:limit]
    # Fashion-MNIST's training mean and standard deviation.
    x = (torch.from_numpy(images.astype(np.float32)) / 255.0 - 0.2860) / 0.3530
    return x, torch.from_numpy(labels.astype(np.int64))


class Net(nn.Module):
    """A small CNN: 54k parameters, >= 88 % test accuracy in 2-3 epochs."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 5, padding=2)
        self.conv2 = nn.Conv2d(8, 16, 5, padding=2)
        self.fc1 = nn.Linear(16 * 7 * 7, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


@dataclasses.dataclass
class RunSpec:
    """One training run: how gradients travel and the hyper-parameters.

    comm: "ddp" (DDP's Gloo allreduce), "gradcomp" (gradcomp.torch.hook
      through one gradcompd per worker) or "torch_powersgd" (PyTorch's
      powerSGD_hook, rank `powersgd_rank`).
    policy: the gradcomp daemons' policy (protobuf JSON of gradcomp.v1.Policy);
      None keeps the daemon's default (dense).
    codec_momentum: the codec applies momentum itself (DGC's momentum
      correction), so the optimizer must not on the tensors it compresses.
    shm: start the daemons with --allow_client_shm, so that the hook passes
      gradients through shared memory instead of inline bytes.
    hook_wrapper: wraps the gradient hook (gradcomp or torch_powersgd), e.g.
      to break it in a test.
    gossip: comm "gradcomp" only: train decentralised, the hook mixing each
      worker's parameters with its neighbours' (gradcomp.Gossip); the
      accuracy reported is the averaged model's.
    """
    comm: str = "gradcomp"
    policy: dict | None = None
    codec_momentum: bool = False
    workers: int = 4
    epochs: int = 4
    batch_size: int = 64        # per worker
    lr: float = 0.1
    momentum: float = 0.9
    seed: int = 0
    train_limit: int | None = None
    test_limit: int | None = None
    powersgd_rank: int = 2
    # torch_powersgd: allreduce densely before this step (2 is the earliest
    # it accepts with error feedback).
    powersgd_start_iter: int = 2
    collective_timeout: str = "120s"
    shm: bool = True            # daemons allow shared memory; the hook uses it
    hook_wrapper: Callable | None = None
    gossip: gradcomp.Gossip | None = None


@dataclasses.dataclass
class RunResult:
    accuracy: list[float]        # test accuracy after each epoch
    step_seconds: float          # mean training step (forward, backward, reduce, update)
    # CPU time per step of rank 0's process (all its threads) plus its
    # daemon: what the exchange costs, less sensitive to other load than wall
    # time.
    cpu_seconds_per_step: float
    bytes_per_step: float        # payload bytes a worker sends per step
    # The same over the steps after the first epoch (every row's warm-up,
    # dense or DGC's, lies in the first epoch).
    bytes_per_step_after_epoch1: float
    raw_bytes_per_step: float    # fp32 gradient bytes per step (what dense sends)
    steps: int
    wall_seconds: float
    transport: str               # gradcomp rows: "shm" or "inline"; else ""
    # Gossip runs (`accuracy` is then the averaged model's): each worker's
    # own model's test accuracy at the end, and after each epoch the
    # consensus distance (1/W) sum_i ||x_i - mean||^2 of the parameters and
    # the same divided by ||mean||^2.
    worker_accuracy: list[float] = dataclasses.field(default_factory=list)
    consensus_distance: list[float] = dataclasses.field(default_factory=list)
    relative_consensus_distance: list[float] = dataclasses.field(default_factory=list)


class _LocalDaemon:
    """This worker's gradcompd, peered with the other workers' daemons."""

    def __init__(self, spec: RunSpec, rank: int, peers: Sequence[str],
                 workdir: pathlib.Path):
        config = {"seed": str(spec.seed)}
        if spec.policy is not None:
            config["policy"] = spec.policy
        config_path = workdir / f"gradcompd.{rank}.json"
        config_path.write_text(json.dumps(config))
        self.metrics_url = ""
        self.target = f"unix:{workdir}/gradcompd.{rank}.sock"
        self.log_path = workdir / f"gradcompd.{rank}.log"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [str(daemon_binary()), f"--listen={self.target}",
                 "--metrics_listen=127.0.0.1:0", f"--config={config_path}",
                 f"--rank={rank}", f"--world_size={spec.workers}",
                 f"--peers={','.join(peers)}",
                 f"--collective_timeout={spec.collective_timeout}",
                 *(["--allow_client_shm"] if spec.shm else [])],
                stdout=log, stderr=subprocess.STDOUT)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def cpu_seconds(self) -> float:
        """User + system CPU time the daemon has used so far."""
        fields = pathlib.Path(f"/proc/{self.process.pid}/stat").read_text()
        utime, stime = fields.rsplit(")", 1)[1].split()[11:13]
        return (int(utime) + int(stime)) / os.sysconf("SC_CLK_TCK")

    def wait_peers(self, peers_up: int, timeout: float = 60.0) -> None:
        """Waits until the start-up line names the metrics port and every
        peer is connected and handshaken."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"gradcompd exited with {self.process.returncode}; "
                                   f"its log:\n{self.log()[-4000:]}")
            if not self.metrics_url:
                match = re.search(r"metrics on (http://\S+/metrics)", self.log())
                self.metrics_url = match.group(1) if match else ""
            elif metrics.total(metrics.scrape(self.metrics_url),
                               "gradcomp_peers_up") >= peers_up:
                return
            time.sleep(0.05)
        raise TimeoutError(f"gradcompd: {peers_up} peers not up within {timeout} s; "
                           f"its log:\n{self.log()[-4000:]}")

    def stop(self) -> None:
        stop_process(self.process)


def _optimizer(spec: RunSpec, model: nn.Module) -> torch.optim.Optimizer:
    if not spec.codec_momentum:
        return torch.optim.SGD(model.parameters(), lr=spec.lr, momentum=spec.momentum)
    # DGC: the codec's momentum correction already turned the gradient of a
    # compressed tensor into the update; momentum again would apply it twice.
    compressed = [p for p in model.parameters()
                  if p.dim() > 1 and p.numel() >= DENSE_BELOW_NUMEL]
    ids = {id(p) for p in compressed}
    dense = [p for p in model.parameters() if id(p) not in ids]
    return torch.optim.SGD([{"params": dense, "momentum": spec.momentum},
                            {"params": compressed, "momentum": 0.0}], lr=spec.lr)


def _count_allreduce_bytes(counter: list[int]) -> None:
    """Counts the bytes of every torch.distributed.all_reduce from Python
    (powerSGD_hook's P, Q and uncompressed tensors) into counter[0]."""
    original = dist.all_reduce

    def counting(tensor, *args, **kwargs):
        counter[0] += tensor.numel() * tensor.element_size()
        return original(tensor, *args, **kwargs)

    dist.all_reduce = counting


def _correct(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> int:
    """How many of `x` the model classifies right."""
    model.eval()
    with torch.no_grad():
        correct = sum(int((model(x[i:i + 1000]).argmax(1) == y[i:i + 1000]).sum())
                      for i in range(0, len(x), 1000))
    model.train()
    return correct


def _evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, rank: int,
              world: int) -> float:
    """Test accuracy of `model` (the same on every rank), each rank
    evaluating its 1/W share."""
    xs, ys = x[rank::world], y[rank::world]
    counts = torch.tensor([_correct(model, xs, ys), len(xs)], dtype=torch.float64)
    _UNCOUNTED_ALL_REDUCE(counts)
    return float(counts[0] / counts[1])


def _evaluate_gossip(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                     rank: int, world: int) -> tuple[float, float, float]:
    """Gossip training, where every rank's model differs: (test accuracy of
    the ranks' averaged model, consensus distance (1/W) sum_i ||x_i -
    mean||^2, that divided by ||mean||^2), all over Gloo, uncounted."""
    flat = nn.utils.parameters_to_vector(model.parameters()).detach()
    mean = flat.clone()
    _UNCOUNTED_ALL_REDUCE(mean)
    mean /= world
    spread = torch.tensor([float(((flat - mean) ** 2).sum())], dtype=torch.float64)
    _UNCOUNTED_ALL_REDUCE(spread)
    distance = float(spread[0]) / world
    averaged = copy.deepcopy(model)
    nn.utils.vector_to_parameters(mean, averaged.parameters())
    return (_evaluate(averaged, x, y, rank, world), distance,
            distance / float((mean.double() ** 2).sum()))


def _worker_accuracies(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                       world: int) -> list[float]:
    """Every rank's own model's accuracy on the whole test set."""
    own = torch.tensor([_correct(model, x, y) / len(x)], dtype=torch.float64)
    every = [torch.zeros_like(own) for _ in range(world)]
    dist.all_gather(every, own)
    return [float(a[0]) for a in every]


def _worker(rank: int, spec: RunSpec, ports: dict, workdir: str) -> None:
    torch.set_num_threads(1)
    workdir = pathlib.Path(workdir)
    world = spec.workers
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(ports["master"]),
                      GLOO_SOCKET_IFNAME="lo")
    daemon = None
    if spec.comm == "gradcomp":
        peers = [f"127.0.0.1:{p}" for p in ports["peers"]]
        daemon = _LocalDaemon(spec, rank, peers, workdir)
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world)
        if daemon is not None:
            daemon.wait_peers(world - 1)
        result = _train(rank, spec, daemon)
        # Joins Gloo's threads while the interpreter is still up: one still
        # running or releasing a Python future callback (powerSGD_hook's)
        # when finalization begins is ended by Python through a noexcept
        # libtorch frame, and std::terminate aborts the worker. Only on
        # success: after an error a peer may hold a collective open, and
        # the join would wait for Gloo's timeout.
        dist.destroy_process_group()
        if rank == 0:
            (workdir / "result.json").write_text(json.dumps(dataclasses.asdict(result)))
    finally:
        if daemon is not None:
            daemon.stop()


def _train(rank: int, spec: RunSpec, daemon: _LocalDaemon | None) -> RunResult:
    world = spec.workers
    x_train, y_train = load_split("train", spec.train_limit)
    x_test, y_test = load_split("t10k", spec.test_limit)
    torch.manual_seed(spec.seed)  # the same initial model on every rank and row
    net = Net()
    raw_bytes = 4 * sum(p.numel() for p in net.parameters())
    model = nn.parallel.DistributedDataParallel(net)
    state = None
    allreduce_bytes = [0]
    if spec.comm == "gradcomp":
        state = gradcomp.torch.HookState(net, daemon.target, job="fashion_mnist",
                                         timeout=300.0, gossip=spec.gossip)
        hook = gradcomp.torch.hook
    elif spec.comm == "torch_powersgd":
        state = torch_powersgd.PowerSGDState(
            process_group=None, matrix_approximation_rank=spec.powersgd_rank,
            start_powerSGD_iter=spec.powersgd_start_iter, random_seed=spec.seed)
        hook = torch_powersgd.powerSGD_hook
        _count_allreduce_bytes(allreduce_bytes)
    elif spec.comm == "ddp":
        hook = None
    else:
        raise ValueError(f"comm '{spec.comm}': expected ddp, gradcomp or torch_powersgd")
    if spec.gossip is not None and spec.comm != "gradcomp":
        raise ValueError(f"gossip needs comm 'gradcomp', got '{spec.comm}'")
    if hook is not None:
        model.register_comm_hook(state, spec.hook_wrapper(hook) if spec.hook_wrapper
                                 else hook)
    optimizer = _optimizer(spec, model.module)
    per_step = spec.batch_size * world
    steps_per_epoch = len(x_train) // per_step
    total_steps = spec.epochs * steps_per_epoch
    # Linear warm-up over a quarter epoch (the first steps' large gradients
    # can kill ReLUs), then cosine decay to zero, so that the final accuracy
    # reflects the run rather than the last few steps' noise.
    warmup = max(steps_per_epoch // 4, 1)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda t: min(1.0, (t + 1) / warmup) *
        0.5 * (1.0 + math.cos(math.pi * t / total_steps)))

    accuracy, step_times = [], []
    distances, relative_distances = [], []
    sent_before = (0, 0)  # (bytes, steps) at the end of the first epoch
    cpu = 0.0  # this process's and its daemon's, within the steps alone
    start = time.perf_counter()
    for epoch in range(spec.epochs):
        order = torch.randperm(len(x_train),
                               generator=torch.Generator().manual_seed(spec.seed * 1000 + epoch))
        for s in range(steps_per_epoch):
            idx = order[s * per_step + rank * spec.batch_size:
                        s * per_step + (rank + 1) * spec.batch_size]
            d0 = daemon.cpu_seconds() if daemon else 0.0
            t0, c0 = time.perf_counter(), time.process_time()
            optimizer.zero_grad()
            F.cross_entropy(model(x_train[idx]), y_train[idx]).backward()
            optimizer.step()
            step_times.append(time.perf_counter() - t0)
            cpu += time.process_time() - c0
            if daemon:
                cpu += daemon.cpu_seconds() - d0
            schedule.step()
        if epoch == 0:
            sent_before = _sent(spec, state, allreduce_bytes, raw_bytes, steps_per_epoch)
        if spec.gossip is None:
            accuracy.append(_evaluate(model.module, x_test, y_test, rank, world))
        else:
            averaged, distance, relative = _evaluate_gossip(
                model.module, x_test, y_test, rank, world)
            accuracy.append(averaged)
            distances.append(distance)
            relative_distances.append(relative)
            state.consensus_distance = distance  # reported with every request
        if rank == 0:
            print(f"epoch {epoch + 1}: test accuracy {accuracy[-1]:.4f}"
                  + (f", consensus distance {distances[-1]:.3g}" if distances else ""),
                  flush=True)
    wall = time.perf_counter() - start
    worker_accuracy = (_worker_accuracies(model.module, x_test, y_test, world)
                       if spec.gossip is not None else [])
    transport = ""
    sent, steps = _sent(spec, state, allreduce_bytes, raw_bytes, total_steps)
    later = (sent - sent_before[0]) / max(steps - sent_before[1], 1)
    if spec.comm == "gradcomp":
        transport = state.transport
        # Training is over: end the job on this worker's daemon (its codec
        # state is freed; a daemon that outlives the run needs this).
        state.release_job()
        state.close()
    # The first steps pay for lazy set-up (buckets, connections): leave them out.
    measured = step_times[min(10, len(step_times) - 1):]
    return RunResult(accuracy=accuracy, step_seconds=float(np.mean(measured)),
                     cpu_seconds_per_step=cpu / total_steps,
                     bytes_per_step=sent / max(steps, 1),
                     bytes_per_step_after_epoch1=later,
                     raw_bytes_per_step=raw_bytes, steps=total_steps,
                     wall_seconds=wall, transport=transport,
                     worker_accuracy=worker_accuracy, consensus_distance=distances,
                     relative_consensus_distance=relative_distances)


def _sent(spec: RunSpec, state, allreduce_bytes: list[int], raw_bytes: int,
          steps: int) -> tuple[int, int]:
    """(bytes this worker has sent, steps they span) so far."""
    if spec.comm == "gradcomp":
        return state.stats.wire_bytes, state.stats.steps
    if spec.comm == "torch_powersgd":
        return allreduce_bytes[0], steps
    return raw_bytes * steps, steps


def run(spec: RunSpec) -> RunResult:
    """Trains with spec.workers processes (and their daemons); rank 0's result."""
    ports = {"master": free_port(), "peers": [free_port() for _ in range(spec.workers)]}
    with tempfile.TemporaryDirectory(prefix="fashion-mnist-") as workdir:
        mp.spawn(_worker, args=(spec, ports, workdir), nprocs=spec.workers, join=True)
        return RunResult(**json.loads((pathlib.Path(workdir) / "result.json").read_text()))


def codec_policy(codec: str, params: dict[str, object] | None = None,
                 warmup_steps: int = 0,
                 dense_below_numel: int = DENSE_BELOW_NUMEL) -> dict:
    """A daemon policy that sends every tensor of at least `dense_below_numel`
    values and 2 or more dimensions through `codec`, after `warmup_steps`
    dense steps."""
    return {"warmup_steps": str(warmup_steps),
            "dense_below_numel": str(dense_below_numel),
            "dense_1d": True,
            "rules": [{"name_glob": "*", "codec": {
                "name": codec, "params": {k: str(v) for k, v in (params or {}).items()}}}]}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--comm", default="gradcomp", choices=["ddp", "gradcomp", "torch_powersgd"])
    p.add_argument("--codec", default=None, help="gradcomp: codec of the daemons' policy")
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--warmup_steps", type=int, default=0,
                   help="gradcomp: dense steps before the codec (the policy's "
                        "warmup_steps); torch_powersgd: start_powerSGD_iter "
                        "(at least 2)")
    p.add_argument("--dgc", action="store_true",
                   help="the codec applies momentum (topk): the optimizer does not")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train_limit", type=int, default=None,
                   help="train on the first N images (default: all 60000)")
    p.add_argument("--test_limit", type=int, default=None,
                   help="test on the first N images (default: all 10000)")
    p.add_argument("--inline", action="store_true",
                   help="gradcomp: inline bytes instead of shared memory")
    p.add_argument("--gossip", default=None, metavar="TOPOLOGY",
                   help="gradcomp: train decentralised, gossiping the "
                        "parameters on this topology (ring, torus, full, edges:...)")
    p.add_argument("--gossip_rank", type=int, default=1,
                   help="PowerGossip rank; 0 = exact gossip")
    p.add_argument("--gossip_power_steps", type=int, default=1)
    p.add_argument("--gossip_diffusion", type=float, default=0.0,
                   help="gossip step size gamma (0: the daemon's default, 1.0)")
    p.add_argument("--dense_below_numel", type=int, default=DENSE_BELOW_NUMEL,
                   help="the policy sends tensors under this many values dense; "
                   "0 with --codec=powersgd compresses every matrix, as "
                   "powerSGD_hook does (the codec's min_compression_rate decides)")
    args = p.parse_args(argv)
    params = dict(kv.split("=", 1) for kv in args.param)
    spec = RunSpec(comm=args.comm,
                   policy=(codec_policy(args.codec, params, args.warmup_steps,
                                        args.dense_below_numel)
                           if args.codec else None),
                   powersgd_start_iter=max(args.warmup_steps, 2),
                   codec_momentum=args.dgc, workers=args.workers, epochs=args.epochs,
                   batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                   train_limit=args.train_limit, test_limit=args.test_limit,
                   shm=not args.inline,
                   gossip=(gradcomp.Gossip(args.gossip, args.gossip_rank,
                                           args.gossip_power_steps,
                                           args.gossip_diffusion)
                           if args.gossip else None))
    result = run(spec)
    print(json.dumps(dataclasses.asdict(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
