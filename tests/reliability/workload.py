"""The soak and chaos workload: a scaled ResNet-50 tensor set whose every
rank's gradient at every step any process can recompute, and the checks of a
result against the true mean.

    tensors = Workload(seed=7, world=4, every=8)
    grads = tensors.gradients(rank=2, step=31)        # {name: float32 array}
    mean = tensors.true_mean(step=31)                 # {name: float64 array}
    bad = check_result("qsgd", CODECS["qsgd"], out, [tensors.gradients(r, 31) ...])

Tensor set: the 161 parameters of ResNet-50 (gradcomp.resnet50: same names,
order, kernel sizes and ranks) with every channel count divided by
WIDTH_DIVISOR (16), about 105,000 values (0.4 MB) instead of 25.6M: 10,000
steps of the full set on 4 ranks would take days on a 2-core machine, and
what the soak looks for (leaks per request, per stream, per tensor, per
step) grows with the number of requests and tensors, which the scaled set
keeps. On this machine even that set costs ~0.5 s a step (the daemons'
per-tensor work dominates: 161 tensors x 4 ranks x 6 peer messages), so
the soak and chaos runs default to every 8th parameter plus the classifier
(every=8: 22 tensors, 22,298 values; still 1x1, 3x3 and 7x7 convolutions,
batch-norm vectors and the fully connected layer).

Gradients: rank r's gradient of tensor T at step t is a * roll(B_r[T], k)
with B_r[T] the synthetic gradient of gradcomp.resnet50 (seed, rank) and a
(log-normal) and k (a shift) drawn from numpy's generator seeded with
(seed, rank, step), so every process derives every rank's data alone, cheaply, and
the top-k positions move every step.
"""
from __future__ import annotations

import dataclasses
import hashlib
import struct

import numpy as np

from gradcomp import resnet50

WIDTH_DIVISOR = 16

# The codecs the runs rotate through, with the parameters they send, and how
# each result is checked (check_result).
CODECS: dict[str, dict[str, object]] = {
    "none": {},
    "fp16": {},
    "qsgd": {"bits": 4, "bucket": 512},
    # momentum 0: the DGC state is then only the residual ("dgc.v"), which
    # the top-k identity below reads back through ExportState.
    "topk": {"ratio": 0.01, "momentum": 0},
}

_U32 = 2.0 ** -24  # unit roundoff of float32 (round to nearest)


def _scaled(param: resnet50.Param) -> resnet50.Param:
    shape = list(param.shape)
    # Output and input channels (or classes and features) shrink; kernels stay.
    for axis in range(min(2, len(shape))):
        shape[axis] = max(1, shape[axis] // WIDTH_DIVISOR)
    return dataclasses.replace(param, shape=tuple(shape))


class Workload:
    """Every rank's gradients of the scaled ResNet-50 set, by step."""

    def __init__(self, seed: int, world: int, every: int = 1):
        """`every` > 1 keeps every `every`-th parameter and the classifier."""
        self.seed = seed
        self.world = world
        self.params = [_scaled(p) for i, p in enumerate(resnet50.parameters())
                       if i % every == 0 or p.name.startswith("fc.")]
        self.names = [p.name for p in self.params]
        self._bases: dict[int, dict[str, np.ndarray]] = {}

    @property
    def numel(self) -> int:
        return sum(p.numel for p in self.params)

    def _base(self, rank: int) -> dict[str, np.ndarray]:
        if rank not in self._bases:
            rng = np.random.default_rng([self.seed, rank])
            self._bases[rank] = {p.name: resnet50.synthetic_gradient(p, rng)
                                 for p in self.params}
        return self._bases[rank]

    def gradients(self, rank: int, step: int) -> dict[str, np.ndarray]:
        """{name: float32 gradient} of `rank` at `step`."""
        base = self._base(rank)
        rng = np.random.default_rng([self.seed, rank, step])
        scales = rng.lognormal(0.0, 0.3, size=len(self.params)).astype(np.float32)
        shifts = rng.integers(0, 1 << 30, size=len(self.params))
        out = {}
        for i, p in enumerate(self.params):
            b = base[p.name]
            out[p.name] = (np.roll(b.ravel(), int(shifts[i]) % b.size)
                           .reshape(b.shape) * scales[i])
        return out

    def all_gradients(self, step: int) -> list[dict[str, np.ndarray]]:
        return [self.gradients(r, step) for r in range(self.world)]

    def projections(self, name: str) -> np.ndarray:
        """Two fixed random vectors (rows) for `name`'s top-k identity."""
        i = self.names.index(name)
        n = self.params[i].numel
        rng = np.random.default_rng([self.seed, 1 << 20, i])
        return rng.standard_normal((2, n))


def true_mean(grads: list[dict[str, np.ndarray]], name: str) -> np.ndarray:
    return sum(g[name].astype(np.float64) for g in grads) / len(grads)


def _qsgd_bound(grads: list[dict[str, np.ndarray]], name: str,
                bits: int, bucket: int) -> np.ndarray:
    """Per element, the most QSGD's average can be off the true mean:
    each rank's value moves by less than one level, ||v_bucket|| / s."""
    levels = (1 << (bits - 1)) - 1
    n = grads[0][name].size
    pad = (-n) % bucket
    bound = np.zeros(n + pad)
    for g in grads:
        v = np.concatenate([g[name].ravel().astype(np.float64), np.zeros(pad)])
        norms = np.sqrt(np.square(v.reshape(-1, bucket)).sum(axis=1))
        bound += np.repeat(norms, bucket)
    return bound[:n] / (levels * len(grads))


def check_result(codec: str, params: dict[str, object], out: np.ndarray,
                 grads: list[dict[str, np.ndarray]], name: str) -> str | None:
    """None if `out` (the daemon's average of `name`, reduced with `codec`)
    is within the codec's documented error of the true mean, else what is
    wrong. Top-k carries error feedback, whose per-step error has no bound
    of its own: its results are checked by the identity in topk_terms."""
    if out.shape != grads[0][name].shape or out.dtype != np.float32:
        return f"{name}: got {out.dtype} {list(out.shape)}, expected float32 " \
               f"{list(grads[0][name].shape)}"
    if not np.all(np.isfinite(out)):
        return f"{name}: non-finite values in the result"
    mean = true_mean(grads, name).ravel()
    abs_mean = sum(np.abs(g[name].astype(np.float64)) for g in grads).ravel() / len(grads)
    err = np.abs(out.astype(np.float64).ravel() - mean)
    if codec == "none":
        # fp32 sum of W fp32 values in rank order, then 1/W: a few roundings.
        bound = 4 * _U32 * len(grads) * abs_mean + 1e-38
    elif codec == "fp16":
        # Each input cast to fp16 (2^-11 relative, 2^-25 absolute below
        # 2^-14), the fp32 sum rounded once more to fp16: the documented
        # error of peers.md, with the subnormal floor.
        bound = 2.0 ** -11 * (abs_mean + np.abs(mean)) + 4 * _U32 * len(grads) * abs_mean \
            + 2.0 ** -22
    elif codec == "qsgd":
        bound = _qsgd_bound(grads, name, int(params["bits"]), int(params["bucket"])) \
            * (1 + 1e-5) + 8 * _U32 * abs_mean + 1e-38
    else:
        raise ValueError(f"no per-result bound for codec {codec!r}")
    worst = int(np.argmax(err - bound))
    if err[worst] > bound[worst]:
        return (f"{name} ({codec}): element {worst} is {out.ravel()[worst]:.9g}, "
                f"true mean {mean[worst]:.9g}, error {err[worst]:.3g} > "
                f"bound {bound[worst]:.3g}")
    return None


def digest(results: dict[str, np.ndarray]) -> str:
    """One hash of a step's results, to compare ranks."""
    h = hashlib.blake2b(digest_size=12)
    for name in sorted(results):
        h.update(name.encode())
        h.update(np.ascontiguousarray(results[name]).tobytes())
    return h.hexdigest()


def parse_state(blob: bytes) -> dict[str, dict[str, np.ndarray]]:
    """{tensor: {buffer: float32 values}} of an ExportState blob (format in
    codecs/state.cc: "GCST", u32 version 1 or 2, tensors with named fp32
    buffers)."""
    if blob[:4] != b"GCST":
        raise ValueError(f"state blob starts with {blob[:4]!r}, expected b'GCST'")
    pos = 4

    def take(fmt: str) -> tuple:
        nonlocal pos
        values = struct.unpack_from("<" + fmt, blob, pos)
        pos += struct.calcsize("<" + fmt)
        return values

    def text() -> str:
        nonlocal pos
        (length,) = take("I")
        value = blob[pos:pos + length].decode()
        pos += length
        return value

    (version,) = take("I")
    if version not in (1, 2):
        raise ValueError(f"state blob version {version}, expected 1 or 2")
    if version >= 2:
        take("II")  # the exporter's rank and world size
    (count,) = take("I")
    out: dict[str, dict[str, np.ndarray]] = {}
    for _ in range(count):
        tensor = text()
        take("i")  # dtype
        if version >= 2:
            text()  # the owning codec
        (ndim,) = take("I")
        take(f"{ndim}q")
        (buffers,) = take("I")
        out[tensor] = {}
        for _ in range(buffers):
            buffer = text()
            (size,) = take("Q")
            out[tensor][buffer] = np.frombuffer(blob, np.float32, size, pos)
            pos += 4 * size
    return out


def topk_terms(workload: Workload, out: np.ndarray | None, name: str,
               grads: list[dict[str, np.ndarray]] | None,
               residual: np.ndarray | None) -> list[float]:
    """The numbers of one rank's top-k step for the identity (momentum 0):

        W * out_t - sum_r g_r,t = sum_r (e_r,t-1 - e_r,t)

    (e_r: rank r's residual, "dgc.v"), taken along two fixed random
    projections p so that each rank writes 8 numbers per tensor and step:
    p.(W out - sum g) and its magnitude |p|.(W |out| + sum |g|) (the same on
    every rank), then p.e_r,t and |p|.|e_r,t| of this rank. A driver adds
    the ranks up (tests/reliability/soak.py)."""
    p = workload.projections(name)
    terms = []
    if out is None:
        terms += [0.0] * 4
    else:
        w = len(grads)
        lhs = w * out.astype(np.float64).ravel() - sum(
            g[name].astype(np.float64).ravel() for g in grads)
        mag = w * np.abs(out.astype(np.float64).ravel()) + sum(
            np.abs(g[name].astype(np.float64).ravel()) for g in grads)
        terms += [float(p[0] @ lhs), float(np.abs(p[0]) @ mag),
                  float(p[1] @ lhs), float(np.abs(p[1]) @ mag)]
    e = np.zeros(p.shape[1]) if residual is None else residual.astype(np.float64)
    terms += [float(p[0] @ e), float(np.abs(p[0]) @ np.abs(e)),
              float(p[1] @ e), float(np.abs(p[1]) @ np.abs(e))]
    return terms
