"""PyTorch's own GPU formulations of the codecs, timed like
bench/cuda_codec_benchmark.cc (CUDA events, 3 warm-up runs, mean of 20), on
the same sizes and device. One JSON object per line on stdout.

    /usr/bin/python3 bench/cuda_torch_reference.py [n ...]

tools/gpu_test runs it on the GPU machine. Exits 2 when torch sees no GPU.
"""

import json
import sys

import torch

from cuda_timing import time_ms


def report(op: str, n: int, ms: float, bytes_moved: float, copy_gbps: float) -> None:
    gbps = bytes_moved / (ms * 1e6)
    print(json.dumps({"impl": "torch", "op": op, "n": n, "ms": round(ms, 4),
                      "bytes_moved": bytes_moved, "gbps": round(gbps, 1),
                      "fraction_of_copy": round(gbps / copy_gbps, 3)}), flush=True)


def int8_encode(x: torch.Tensor, bucket: int) -> torch.Tensor:
    b = x.view(-1, bucket)
    lo = b.amin(dim=1, keepdim=True)
    hi = b.amax(dim=1, keepdim=True)
    inverse = 255.0 / (hi - lo).clamp_min(1e-30)
    return ((b - lo) * inverse + 0.5).floor().clamp_(0, 255).to(torch.uint8)


def qsgd_encode(x: torch.Tensor, bucket: int, bits: int) -> torch.Tensor:
    levels = (1 << (bits - 1)) - 1
    b = x.view(-1, bucket)
    norms = b.norm(dim=1, keepdim=True)
    level = (b.abs() * (levels / norms) + torch.rand_like(b)).floor_().clamp_(max=levels)
    # One byte per code: PyTorch has no bit packing; this flatters torch.
    return (level.to(torch.uint8) | (b < 0).to(torch.uint8) << (bits - 1))


def int8_decode_add(q: torch.Tensor, lo: torch.Tensor, step: torch.Tensor,
                    alpha: float, acc: torch.Tensor) -> None:
    acc.view(q.shape).add_((lo + q.float() * step) * alpha)


def qsgd_decode_add(codes: torch.Tensor, norms: torch.Tensor, bits: int,
                    alpha: float, acc: torch.Tensor) -> None:
    levels = (1 << (bits - 1)) - 1
    value = (codes & levels).float() * (norms * (alpha / levels))
    negative = (codes >> (bits - 1)).bool()
    acc.view(codes.shape).add_(torch.where(negative, -value, value))


def run_single_pass(x: torch.Tensor, acc: torch.Tensor, copy_gbps: float) -> None:
    """signsgd, TernGrad (bucket 512, clip 2.5 sigma) and random-k (ratio 0.01)
    as PyTorch writes them; bytes counted as in bench/cuda_codec_benchmark.cc
    (input once, payload as gradcomp packs it)."""
    n = x.numel()
    sign_bytes = 8.0 * ((n + 63) // 64)
    report("signsgd_encode", n,
           time_ms(lambda: (x.abs().mean(), torch.signbit(x))), 4.0 * n + sign_bytes + 4,
           copy_gbps)
    scale = x.abs().mean()
    negative = torch.signbit(x)
    report("signsgd_decode", n,
           time_ms(lambda: acc.add_(torch.where(negative, -scale, scale), alpha=0.25)),
           4.0 + sign_bytes + 8.0 * n, copy_gbps)
    usable = n - n % 512
    b = x[:usable].view(-1, 512)

    def terngrad_encode() -> torch.Tensor:
        clip = 2.5 * x.norm() / (n ** 0.5)
        a = b.abs().clamp_(max=clip)
        s = a.amax(dim=1, keepdim=True)
        keep = torch.rand_like(b) < a / s
        return (keep * torch.sign(b)).to(torch.int8), s

    buckets = usable // 512
    report("terngrad_encode", usable, time_ms(terngrad_encode),
           4.0 * usable + 4.0 * buckets + usable / 4.0, copy_gbps)
    codes, s = terngrad_encode()
    accb = acc[:usable].view(-1, 512)
    report("terngrad_decode", usable,
           time_ms(lambda: accb.add_(codes.float() * s, alpha=0.25)),
           4.0 * buckets + usable / 4.0 + 8.0 * usable, copy_gbps)
    k = (n + 99) // 100
    report("randomk_0.01_draw", n, time_ms(lambda: torch.randperm(n, device="cuda")[:k]),
           4.0 * k, copy_gbps)
    idx = torch.randperm(n, device="cuda")[:k].sort().values
    report("randomk_0.01_encode", n, time_ms(lambda: x[idx] * (n / k)), 12.0 * k, copy_gbps)
    vals = x[idx]
    report("randomk_0.01_decode", n,
           time_ms(lambda: acc.index_add_(0, idx, vals, alpha=0.25)), 16.0 * k, copy_gbps)


def run(n: int) -> None:
    x = torch.randn(n, device="cuda") * 0.01
    y = torch.empty_like(x)
    in_bytes = 4.0 * n
    copy_ms = time_ms(lambda: y.copy_(x))
    copy_gbps = 2 * in_bytes / (copy_ms * 1e6)
    report("copy", n, copy_ms, 2 * in_bytes, copy_gbps)
    report("fp16_encode", n, time_ms(lambda: x.half()), in_bytes + 2.0 * n, copy_gbps)
    report("bf16_encode", n, time_ms(lambda: x.bfloat16()), in_bytes + 2.0 * n, copy_gbps)
    # Decodes: acc += alpha * body; the accumulator is read and written.
    acc = torch.zeros_like(x)
    acc_bytes = 8.0 * n
    h = x.half()
    report("fp16_decode", n, time_ms(lambda: acc.add_(h, alpha=0.25)), 2.0 * n + acc_bytes,
           copy_gbps)
    bf = x.bfloat16()
    report("bf16_decode", n, time_ms(lambda: acc.add_(bf, alpha=0.25)), 2.0 * n + acc_bytes,
           copy_gbps)
    report("none_decode", n, time_ms(lambda: acc.add_(x, alpha=0.25)), in_bytes + acc_bytes,
           copy_gbps)
    usable = n - n % 1024
    xb = x[:usable]
    report("int8_encode", usable, time_ms(lambda: int8_encode(xb, 1024)),
           4.0 * usable + 8.0 * usable / 1024 + usable, copy_gbps)
    q8 = int8_encode(xb, 1024)
    lo = xb.view(-1, 1024).amin(dim=1, keepdim=True)
    step = (xb.view(-1, 1024).amax(dim=1, keepdim=True) - lo) / 255.0
    acc8 = acc[:usable]
    report("int8_decode", usable, time_ms(lambda: int8_decode_add(q8, lo, step, 0.25, acc8)),
           8.0 * usable / 1024 + usable + 8.0 * usable, copy_gbps)
    usable = n - n % 512
    xq = x[:usable]
    for bits in (2, 4, 8):
        report(f"qsgd{bits}_encode", usable, time_ms(lambda: qsgd_encode(xq, 512, bits)),
               4.0 * usable + 4.0 * usable / 512 + usable * bits / 8.0, copy_gbps)
        codes = qsgd_encode(xq, 512, bits)
        norms = xq.view(-1, 512).norm(dim=1, keepdim=True)
        accq = acc[:usable]
        report(f"qsgd{bits}_decode", usable,
               time_ms(lambda: qsgd_decode_add(codes, norms, bits, 0.25, accq)),
               4.0 * usable / 512 + usable * bits / 8.0 + 8.0 * usable, copy_gbps)
    run_single_pass(x, acc, copy_gbps)
    k = max(1, n // 1000)
    report("topk_0.001", n, time_ms(lambda: torch.topk(x.abs(), k, sorted=False)),
           in_bytes + 8.0 * k, copy_gbps)


def main() -> int:
    if not torch.cuda.is_available():
        print("cuda_torch_reference: torch sees no CUDA device", file=sys.stderr)
        return 2
    sizes = [int(a) for a in sys.argv[1:]] or [25_000_000, 100_000_000]
    print(json.dumps({"impl": "torch", "device": torch.cuda.get_device_name(0),
                      "torch": torch.__version__}), flush=True)
    for n in sizes:
        run(n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
