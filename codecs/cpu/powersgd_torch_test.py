#!/usr/bin/python3
"""gradcomp's `powersgd` against PyTorch's own powerSGD_hook.

Two gloo processes train a one-parameter DDP model whose gradient is set to
given matrices; the hook (error feedback and warm start on, every matrix
compressed) averages them. The same matrices, with the same first Q, go
through //codecs/cpu:powersgd_reference_tool. The outputs of every step must
agree to fp32 accuracy, at rank 2 (Gram-Schmidt in PyTorch) and rank 4
(PyTorch switches to QR, whose column signs may differ; the product P Q^T
does not depend on them).

Usage: powersgd_torch_test.py PATH_TO_powersgd_reference_tool
"""
import datetime
import faulthandler
import os
import struct
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

WORLD = 2
# Seconds after which a worker (and twice that, the test) gives up with a
# stack dump: gloo set-up under heavy load was seen to hang.
WATCHDOG_SECONDS = 120
STEPS = 4
ROWS, COLS = 24, 40
# The hook runs plain allreduce for its first START iterations (it requires
# START > 1 with error feedback); the compared steps follow them.
START = 2

TOOL = None


class Matrix(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(ROWS, COLS))

    def forward(self, target):
        # d/dweight of sum(weight * target) is target: the gradient is given.
        return (self.weight * target).sum()


def worker(rank: int, init_file: str, rank_r: int, grads: np.ndarray,
           q0: np.ndarray, out_path: str) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    # A worker stuck in gloo dumps its stack and exits instead of hanging.
    faulthandler.dump_traceback_later(WATCHDOG_SECONDS, exit=True)
    # A stuck peer fails the test within a minute instead of hanging it.
    dist.init_process_group("gloo", init_method="file://" + init_file,
                            rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=60))
    model = torch.nn.parallel.DistributedDataParallel(Matrix())
    state = psgd.PowerSGDState(process_group=None,
                               matrix_approximation_rank=rank_r,
                               start_powerSGD_iter=START,
                               min_compression_rate=0,
                               use_error_feedback=True, warm_start=True)
    model.register_comm_hook(state, psgd.powerSGD_hook)
    zeros = torch.zeros(ROWS, COLS)
    for _ in range(START):
        model.zero_grad()
        model(zeros).backward()
    # The warm start the hook finds for bucket 0 is our Q0 (it
    # orthonormalises it, as gradcomp does).
    state.p_memory_dict[0] = torch.empty(ROWS * rank_r)
    state.q_memory_dict[0] = torch.from_numpy(q0.reshape(-1).copy())
    outputs = []
    for t in range(STEPS):
        model.zero_grad()
        model(torch.from_numpy(grads[t, rank].copy())).backward()
        outputs.append(model.module.weight.grad.detach().numpy().copy())
    if rank == 0:
        np.save(out_path, np.stack(outputs))
    # Neither side may tear gloo down while the other still talks to it.
    dist.barrier()
    # Then leave without the interpreter's finalization. barrier() returns
    # when its work completes, and a gloo worker thread
    # (ProcessGroupGloo::runLoop) drops its last reference to a work item
    # only after that: when this falls inside Py_FinalizeEx, freeing the
    # work's tensor takes the GIL, Python 3.11 ends a thread that does so
    # during finalization with pthread_exit, and its forced unwind through
    # the noexcept ~TensorImpl calls std::terminate ("terminate called
    # without an active exception", SIGABRT; 7 of 47 test runs here, seen in
    # a core dump's stacks). Everything compared is on disk by now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def torch_outputs(rank_r, grads, q0):
    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "torch.npy")
        mp.spawn(worker, args=(os.path.join(tmp, "init"), rank_r, grads, q0,
                               out_path), nprocs=WORLD, join=True)
        return np.load(out_path)


def gradcomp_outputs(rank_r, grads, q0):
    with tempfile.TemporaryDirectory() as tmp:
        in_path = os.path.join(tmp, "in.bin")
        out_path = os.path.join(tmp, "out.bin")
        with open(in_path, "wb") as f:
            f.write(struct.pack("<5q", WORLD, STEPS, ROWS, COLS, rank_r))
            f.write(q0.astype("<f4").tobytes())
            f.write(grads.astype("<f4").tobytes())
        subprocess.run([TOOL, in_path, out_path], check=True)
        out = np.fromfile(out_path, dtype="<f4")
        return out.reshape(STEPS, ROWS, COLS)


def make_inputs(rank_r, seed):
    """Gradients with a dominant low-rank part (distinct singular values, so
    that the subspace is well determined) plus noise, per worker and step."""
    gen = np.random.default_rng(seed)
    u, _ = np.linalg.qr(gen.standard_normal((ROWS, rank_r + 1)))
    v, _ = np.linalg.qr(gen.standard_normal((COLS, rank_r + 1)))
    scales = np.array([8.0 / (1 + i) for i in range(rank_r + 1)])
    grads = np.empty((STEPS, WORLD, ROWS, COLS), dtype=np.float32)
    for t in range(STEPS):
        for w in range(WORLD):
            jitter = 1 + 0.1 * gen.standard_normal(rank_r + 1)
            low = (u * (scales * jitter)) @ v.T
            grads[t, w] = low + 0.05 * gen.standard_normal((ROWS, COLS))
    q0 = gen.standard_normal((COLS, rank_r)).astype(np.float32)
    return grads, q0


class PowerSgdMatchesTorchTest(unittest.TestCase):
    def check(self, rank_r, seed):
        grads, q0 = make_inputs(rank_r, seed)
        ours = gradcomp_outputs(rank_r, grads, q0)
        theirs = torch_outputs(rank_r, grads, q0)
        for t in range(STEPS):
            rel = np.linalg.norm(ours[t] - theirs[t]) / np.linalg.norm(
                theirs[t])
            # fp32 arithmetic in different orders on both sides, over a few
            # steps of error feedback: agreement to ~1e-6; a wrong formula
            # (no mean of Q, no error feedback, another warm start) is off by
            # more than 1e-2.
            self.assertLess(rel, 1e-4, f"rank {rank_r} step {t}: {rel}")
            # Not trivially equal: the output is not the input average.
            self.assertGreater(
                np.linalg.norm(theirs[t] - grads[t].mean(axis=0)), 1e-2)

    def test_rank2_gram_schmidt(self):
        self.check(2, 1)

    def test_rank4_qr(self):
        self.check(4, 2)


if __name__ == "__main__":
    faulthandler.dump_traceback_later(WATCHDOG_SECONDS * 2, exit=True)
    TOOL = os.path.abspath(sys.argv[1])
    unittest.main(argv=sys.argv[:1])
