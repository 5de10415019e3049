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
import math
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


# --- The other codecs, as a user would write them in torch ops. Parameters
# are the codecs' defaults, as bench/codec_benchmark.cc's kCases uses them.

RANDOMK_RATIO = 0.01
INT8_BUCKET = 1024
TERNGRAD_BUCKET = 512
TERNGRAD_CLIP_SIGMA = 2.5
THRESHOLD_TAU_RMS = 2.5
SIGNUM_BETA = 0.9
ATOMO_BUDGET = 0.01
POWERSGD_SHAPE = (5000, 5000)  # BM_MatrixStep/powersgd_5000x5000
POWERSGD_RANK = 2
SHIFTS = torch.arange(8, dtype=torch.uint8)


def pack_bits(bits: torch.Tensor) -> torch.Tensor:
    """np.packbits in torch ops (LSB first): 8 bools -> one uint8."""
    pad = (-bits.numel()) % 8
    b = torch.nn.functional.pad(bits.to(torch.uint8), (0, pad)).view(-1, 8)
    return (b << SHIFTS).sum(dim=1, dtype=torch.uint8)


def unpack_signs(packed: torch.Tensor, n: int) -> torch.Tensor:
    """+1.0 / -1.0 per packed bit."""
    bits = (packed.unsqueeze(1) >> SHIFTS) & 1
    return (bits.view(-1)[:n].float() * 2 - 1)


def randomk_encode(g: torch.Tensor, k: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """k distinct indices (randperm), values scaled by n / k (unbiased)."""
    idx = torch.randperm(g.numel())[:k]
    return idx, g[idx] * (g.numel() / k)


def randomk_encode_randint(g: torch.Tensor,
                           k: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """The cheap draw: k indices with replacement (duplicates possible)."""
    idx = torch.randint(g.numel(), (k,))
    return idx, g[idx] * (g.numel() / k)


def threshold_encode(g: torch.Tensor,
                     e: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Gradient dropping with its residual: v = g + e, send |v| >= tau."""
    v = g + e
    tau = THRESHOLD_TAU_RMS * v.norm() / v.numel() ** 0.5
    tau = torch.minimum(tau, v.abs().max())
    idx = (v.abs() >= tau).nonzero().squeeze(1)
    values = v[idx]
    v[idx] = 0
    e.copy_(v)
    return idx, values


def terngrad_encode(g: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Clip to 2.5 sigma; per bucket s = max |v|; s * sign * Bernoulli(|v|/s)."""
    c = TERNGRAD_CLIP_SIGMA * g.norm() / g.numel() ** 0.5
    v = g.clamp(-c, c)
    pad = (-v.numel()) % TERNGRAD_BUCKET
    v = torch.nn.functional.pad(v, (0, pad)).view(-1, TERNGRAD_BUCKET)
    s = v.abs().amax(dim=1, keepdim=True)
    b = torch.bernoulli(v.abs() / s)
    return s, (torch.sign(v) * b).to(torch.int8)


def terngrad_decode_add(s: torch.Tensor, t: torch.Tensor, acc: torch.Tensor,
                        alpha: float) -> None:
    acc.add_((t.float() * s).view(-1)[:acc.numel()], alpha=alpha)


def int8_encode(g: torch.Tensor,
                stochastic: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per bucket min and max, (v - min) / step rounded to uint8."""
    pad = (-g.numel()) % INT8_BUCKET
    v = torch.nn.functional.pad(g, (0, pad)).view(-1, INT8_BUCKET)
    lo, hi = torch.aminmax(v, dim=1, keepdim=True)
    step = (hi - lo) / 255
    x = (v - lo) / step
    x = (x + torch.rand_like(x)).floor() if stochastic else x.round()
    return lo, step, x.to(torch.uint8)


def int8_decode_add(lo: torch.Tensor, step: torch.Tensor, q: torch.Tensor,
                    acc: torch.Tensor, alpha: float) -> None:
    values = (q.float() * step + lo).view(-1)[:acc.numel()]
    acc.add_(values, alpha=alpha)


def signsgd_encode(g: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    return g.abs().mean(), pack_bits(g >= 0)


def signum_encode(g: torch.Tensor,
                  m: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    m.mul_(SIGNUM_BETA).add_(g, alpha=1 - SIGNUM_BETA)
    return m.abs().mean(), pack_bits(m >= 0)


def efsign_encode(g: torch.Tensor,
                  e: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """EF-signSGD: p = g + e, send mean|p| * sign(p), keep the error."""
    p = g + e
    s = p.abs().mean()
    positive = p >= 0
    e.copy_(p - s * (positive.float() * 2 - 1))
    return s, pack_bits(positive)


def sign_decode_add(s: torch.Tensor, packed: torch.Tensor, acc: torch.Tensor,
                    alpha: float) -> None:
    acc.add_(unpack_signs(packed, acc.numel()) * s, alpha=alpha)


def onebit_encode(g: torch.Tensor,
                  e: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """1-bit SGD on a 1-D tensor (one column): means of each side, EF."""
    p = g + e
    positive = p >= 0
    count = positive.sum()
    pos_mean = torch.where(positive, p, 0.0).sum() / count.clamp(min=1)
    neg_mean = torch.where(positive, 0.0, p).sum() / (p.numel() - count).clamp(min=1)
    e.copy_(p - torch.where(positive, pos_mean, neg_mean))
    return pos_mean, neg_mean, pack_bits(positive)


def onebit_decode_add(pos_mean: torch.Tensor, neg_mean: torch.Tensor,
                      packed: torch.Tensor, acc: torch.Tensor,
                      alpha: float) -> None:
    positive = unpack_signs(packed, acc.numel()) > 0
    acc.add_(torch.where(positive, pos_mean, neg_mean), alpha=alpha)


def atomo_entry_encode(g: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """ATOMO over coordinates: Algorithm 1's p, then keep i w.p. p_i, / p_i.

    p_i = min(1, (s - j) |g_i| / (sum of the n - j smallest |g|)), with j the
    number of entries clipped at 1: the largest j such that the (j+1)-th
    largest entry still reaches 1 under that rule.
    """
    a = g.abs()
    s = ATOMO_BUDGET * g.numel()
    desc, _ = a.sort(descending=True)
    # tail[j] = sum of desc[j:], in float64 as the sum is over 25M values.
    tail = desc.double().flip(0).cumsum(0).flip(0)
    j = torch.arange(g.numel(), dtype=torch.float64)
    clipped = int(((s - j) * desc.double() >= tail).sum())
    p = ((s - clipped) * a.double() / tail[clipped]).clamp(max=1).float()
    idx = (torch.rand_like(p) < p).nonzero().squeeze(1)
    return idx, g[idx] / p[idx]


def powersgd_step(m: torch.Tensor, e: torch.Tensor,
                  q: torch.Tensor) -> torch.Tensor:
    """One worker's PowerSGD step, powerSGD_hook's math on one matrix.

    M = grad + e; P = M Q; P = orthonormal(P); Q = M^T P; out = P Q^T;
    e = M - out; Q warm-starts the next step (allreduces are identities).
    """
    mat = m + e
    p = mat @ q
    p, _ = torch.linalg.qr(p)
    q.copy_(mat.t() @ p)
    out = p @ q.t()
    torch.sub(mat, out, out=e)
    return out


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
    k_rand = int(math.ceil(RANDOMK_RATIO * n))
    idx_r, val_r = randomk_encode(g, k_rand)
    res_t = torch.zeros_like(g)
    idx_t, val_t = threshold_encode(g, torch.zeros_like(g))
    tern_s, tern_q = terngrad_encode(g)
    i8 = int8_encode(g, False)
    sign_s, sign_bits = signsgd_encode(g)
    m_signum = torch.zeros_like(g)
    e_efsign = torch.zeros_like(g)
    e_onebit = torch.zeros_like(g)
    ob = onebit_encode(g, torch.zeros_like(g))
    idx_a, val_a = atomo_entry_encode(g)
    rows, cols = POWERSGD_SHAPE
    mat = g[:rows * cols].view(rows, cols)
    e_psgd = torch.zeros_like(mat)
    q_psgd = torch.randn(cols, POWERSGD_RANK,
                         generator=torch.Generator().manual_seed(7))
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
        "randomk_0.01": ("idx = randperm(n)[:k]; g[idx] * n / k",
                         lambda: randomk_encode(g, k_rand)),
        "randomk_randint_0.01": ("idx = randint(n, (k,)); g[idx] * n / k",
                                 lambda: randomk_encode_randint(g, k_rand)),
        "randomk_decode_0.01": ("acc.index_add_(0, idx, 0.5 * vals)",
                                lambda: acc.index_add_(0, idx_r, 0.5 * val_r)),
        "threshold": ("v=g+e; tau=2.5*rms(v); nonzero(|v|>=tau); gather; e=v, e[idx]=0",
                      lambda: threshold_encode(g, res_t)),
        "threshold_decode": ("acc.index_add_(0, idx, 0.5 * vals)",
                             lambda: acc.index_add_(0, idx_t, 0.5 * val_t)),
        "terngrad": ("clamp 2.5 sigma; per-bucket amax; bernoulli; sign",
                     lambda: terngrad_encode(g)),
        "terngrad_decode": ("acc += 0.5 * t * s",
                            lambda: terngrad_decode_add(tern_s, tern_q, acc, 0.5)),
        "int8": ("per-bucket aminmax; ((v-lo)/step).round() to uint8",
                 lambda: int8_encode(g, False)),
        "int8_stochastic": ("per-bucket aminmax; floor(x + rand) to uint8",
                            lambda: int8_encode(g, True)),
        "int8_decode": ("acc += 0.5 * (q * step + lo)",
                        lambda: int8_decode_add(*i8, acc, 0.5)),
        "signsgd": ("g.abs().mean(); packbits(g >= 0) in uint8 ops",
                    lambda: signsgd_encode(g)),
        "signum": ("m = b*m + (1-b)*g; mean|m|; packbits(m >= 0)",
                   lambda: signum_encode(g, m_signum)),
        "efsign": ("p=g+e; s=mean|p|; packbits(p >= 0); e=p-s*sign(p)",
                   lambda: efsign_encode(g, e_efsign)),
        "sign_decode": ("acc += 0.5 * s * unpackbits(bits)",
                        lambda: sign_decode_add(sign_s, sign_bits, acc, 0.5)),
        "onebit": ("p=g+e; means of p>=0, p<0; packbits; e=p-where(..)",
                   lambda: onebit_encode(g, e_onebit)),
        "onebit_decode": ("acc += 0.5 * where(unpackbits, mean+, mean-)",
                          lambda: onebit_decode_add(*ob, acc, 0.5)),
        "atomo_entry_0.01": ("sort |g|; Algorithm 1 p; rand < p; g[idx] / p",
                             lambda: atomo_entry_encode(g)),
        "atomo_entry_decode_0.01": ("acc.index_add_(0, idx, 0.5 * vals)",
                                    lambda: acc.index_add_(0, idx_a, 0.5 * val_a)),
        "powersgd_5000x5000": ("M=g+e; P=M@Q; qr(P); Q=M.T@P; P@Q.T; e=M-PQ^T",
                               lambda: powersgd_step(mat, e_psgd, q_psgd)),
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
