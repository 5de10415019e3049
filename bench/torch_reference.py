"""Times the PyTorch code a user would write for what each gradcomp codec does.

Same data shape and size as bench/codec_benchmark.cc (25M fp32 values,
N(0, 1) times a log-uniform scale per block of 4096), same number of threads
as the machine's cores. Each case runs once to warm up, then `--reps` times;
the best wall time goes to a JSON file that bench/compare.py reads (other
load on the machine only ever adds time).

    /usr/bin/python3 bench/torch_reference.py --out /tmp/torch.json
"""

import argparse
import json
import os
import time
from typing import Callable, Dict, Tuple

import torch

NUMEL = 25_000_000
QSGD_LEVELS = 7  # 4 bits: a sign and 3 level bits
QSGD_BUCKET = 512
MOMENTUM = 0.9


def gradient() -> torch.Tensor:
    gen = torch.Generator().manual_seed(12345)
    blocks = (NUMEL + 4095) // 4096
    scale = 10.0 ** (-4.0 * torch.rand(blocks, generator=gen))
    g = torch.randn(NUMEL, generator=gen)
    return g * scale.repeat_interleave(4096)[:NUMEL]


def qsgd_encode(g: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """QSGD as written in torch ops: levels as int8, not even bit-packed."""
    pad = (-g.numel()) % QSGD_BUCKET
    v = torch.nn.functional.pad(g, (0, pad)).view(-1, QSGD_BUCKET)
    norm = v.norm(dim=1, keepdim=True)
    x = v.abs() / norm * QSGD_LEVELS
    low = x.floor()
    level = low + torch.bernoulli(x - low)
    return norm, (level * torch.sign(v)).to(torch.int8)


def qsgd_decode_add(norm: torch.Tensor, q: torch.Tensor, acc: torch.Tensor,
                    alpha: float) -> None:
    values = (q.float() * (norm / QSGD_LEVELS)).view(-1)[:acc.numel()]
    acc.add_(values, alpha=alpha)


def topk_select(g: torch.Tensor, k: int) -> Tuple[torch.Tensor, torch.Tensor]:
    _, idx = torch.topk(g.abs(), k)
    return idx, g[idx]


def dgc_step(g: torch.Tensor, u: torch.Tensor, v: torch.Tensor,
             k: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """One DGC encode in torch: momentum correction, top-k, masking."""
    u.mul_(MOMENTUM).add_(g)
    v.add_(u)
    _, idx = torch.topk(v.abs(), k)
    values = v[idx]
    v[idx] = 0
    u[idx] = 0
    return idx, values


def cases(g: torch.Tensor) -> Dict[str, Tuple[str, Callable[[], object]]]:
    n = g.numel()
    dst = torch.empty_like(g)
    half = torch.empty(n, dtype=torch.float16)
    bf16 = torch.empty(n, dtype=torch.bfloat16)
    acc = torch.zeros_like(g)
    u = torch.zeros_like(g)
    v = torch.zeros_like(g)
    g_half = g.half()
    k3, k2 = (n + 999) // 1000, (n + 99) // 100
    idx3, val3 = topk_select(g, k3)
    idx2, val2 = topk_select(g, k2)
    norm, q = qsgd_encode(g)
    return {
        "clone": ("g.clone()", lambda: g.clone()),
        "copy": ("dst.copy_(g)", lambda: dst.copy_(g)),
        "half": ("g.half()", lambda: g.half()),
        "half_copy": ("half.copy_(g)", lambda: half.copy_(g)),
        "bfloat16": ("g.bfloat16()", lambda: g.bfloat16()),
        "bfloat16_copy": ("bf16.copy_(g)", lambda: bf16.copy_(g)),
        "half_decode": ("acc.add_(h.float(), alpha=0.5)",
                        lambda: acc.add_(g_half.float(), alpha=0.5)),
        "topk_0.001": ("torch.topk(g.abs(), k); g[idx]",
                       lambda: topk_select(g, k3)),
        "topk_0.01": ("torch.topk(g.abs(), k); g[idx]",
                      lambda: topk_select(g, k2)),
        "dgc_0.001": ("u=m*u+g; v+=u; topk(v.abs()); mask",
                      lambda: dgc_step(g, u, v, k3)),
        "dgc_0.01": ("u=m*u+g; v+=u; topk(v.abs()); mask",
                     lambda: dgc_step(g, u, v, k2)),
        "topk_decode_0.001": ("acc.index_add_(0, idx, 0.5 * vals)",
                              lambda: acc.index_add_(0, idx3, 0.5 * val3)),
        "topk_decode_0.01": ("acc.index_add_(0, idx, 0.5 * vals)",
                             lambda: acc.index_add_(0, idx2, 0.5 * val2)),
        "qsgd_4bit": ("norm, floor, bernoulli, sign per bucket",
                      lambda: qsgd_encode(g)),
        "qsgd_decode_4bit": ("acc += 0.5 * q * norm / s",
                             lambda: qsgd_decode_add(norm, q, acc, 0.5)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    g = gradient()
    results = {
        "torch_version": torch.__version__,
        "threads": torch.get_num_threads(),
        "cases": {},
    }
    for name, (code, fn) in cases(g).items():
        fn()
        times = []
        for _ in range(args.reps):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        ms = 1e3 * min(times)
        results["cases"][name] = {"code": code, "ms": ms}
        print(f"{name:20s} {ms:10.2f} ms   {code}", flush=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
