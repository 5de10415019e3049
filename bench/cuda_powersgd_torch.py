"""PyTorch's GPU formulation of one PowerSGD rank-r encode step, timed like
bench/cuda_powersgd_benchmark.cc (CUDA events, 3 warm-up runs, mean of 20) on
the same shapes: the two GEMMs alone (P = M Q, Q = M^T P), and the step as
torch's powerSGD_hook computes it (M = g + e, P = M Q, orthogonalise P with
the hook's own _orthogonalize (torch.linalg.qr for rank > 2), Q = M^T P,
e = M - P Q^T written in place with addmm_). fp32 products, TF32 off.
One JSON object per line on stdout.

    python3 bench/cuda_powersgd_torch.py [rank]    (default 4)

Exits 2 when torch sees no GPU.
"""

import json
import sys
from typing import Callable

import torch

from cuda_timing import time_ms

SHAPES = [(5000, 5000), (10000, 10000), (512, 4608), (1000, 2048)]


def orthogonalizer() -> tuple[str, Callable[[torch.Tensor], None]]:
    """The hook's in-place orthogonalisation of one rows x r matrix."""
    try:
        from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import (
            _orthogonalize)
        return "powerSGD_hook._orthogonalize", lambda p: _orthogonalize(p.unsqueeze(0))
    except ImportError:
        def qr(p: torch.Tensor) -> None:
            p.copy_(torch.linalg.qr(p).Q)
        return "torch.linalg.qr", qr


def report(op: str, rows: int, cols: int, rank: int, ms: float, gemms_ms: float,
           orth: str) -> None:
    print(json.dumps({"impl": "torch", "op": op, "rows": rows, "cols": cols,
                      "rank": rank, "n": rows * cols, "ms": round(ms, 4),
                      "ratio_to_gemms": round(ms / gemms_ms, 3),
                      "orthogonalize": orth}), flush=True)


def run(rows: int, cols: int, rank: int) -> None:
    gen = torch.Generator(device="cuda").manual_seed(42)
    g = torch.randn(rows, cols, device="cuda", generator=gen) * 0.01
    e = torch.zeros_like(g)
    m = g.clone()
    q0 = torch.linalg.qr(torch.randn(cols, rank, device="cuda", generator=gen)).Q.contiguous()
    p = torch.empty(rows, rank, device="cuda")
    q = torch.empty(cols, rank, device="cuda")
    orth_name, orthogonalize = orthogonalizer()

    def gemms() -> None:
        torch.matmul(m, q0, out=p)
        torch.matmul(m.t(), p, out=q)

    def step() -> None:
        e.add_(g)  # M = g + e, in the residual's buffer
        torch.matmul(e, q0, out=p)
        orthogonalize(p)
        torch.matmul(e.t(), p, out=q)
        e.addmm_(p, q.t(), alpha=-1)  # e = M - P Q^T

    def step_no_error_feedback() -> None:
        torch.matmul(m, q0, out=p)
        orthogonalize(p)
        torch.matmul(m.t(), p, out=q)

    gemms_ms = time_ms(gemms)
    report("copy_m", rows, cols, rank, time_ms(lambda: m.copy_(g)), gemms_ms, orth_name)
    report("two_gemms", rows, cols, rank, gemms_ms, gemms_ms, orth_name)
    report("orthonormalize_p", rows, cols, rank, time_ms(lambda: orthogonalize(p)),
           gemms_ms, orth_name)
    report("encode_step", rows, cols, rank, time_ms(step), gemms_ms, orth_name)
    report("encode_step_no_error_feedback", rows, cols, rank,
           time_ms(step_no_error_feedback), gemms_ms, orth_name)


def main() -> int:
    if not torch.cuda.is_available():
        print("cuda_powersgd_torch: torch sees no GPU", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    rank = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    print(json.dumps({"impl": "torch", "device": torch.cuda.get_device_name(),
                      "torch": torch.__version__}), flush=True)
    for rows, cols in SHAPES:
        run(rows, cols, rank)
    return 0


if __name__ == "__main__":
    sys.exit(main())
