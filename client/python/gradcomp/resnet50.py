"""The parameter tensors of ResNet-50 and synthetic gradients for them.

    params = parameters()            # 161 tensors, 25,557,032 elements
    grads = synthetic_gradients(seed=0)   # {name: float32 array}

Shapes follow torchvision's resnet50 (names included): a 7x7 stem, four
stages of bottleneck blocks (3, 4, 6, 3 blocks; widths 64..512, expansion 4,
a 1x1 projection shortcut in each stage's first block), every convolution
followed by batch norm (weight and bias), and a 2048 -> 1000 classifier.

The gradient model is a model, not recorded data. It reproduces the features
that matter to gradient compressors:
  * scale varies per layer: a layer's gradient RMS is drawn log-normally
    around a depth trend (larger towards the classifier, as with batch norm
    in residual nets), spanning about two orders of magnitude;
  * scale varies within a layer: each convolution output channel (and each
    classifier row) gets its own log-normal factor, since filters and classes
    are not equally active in a batch;
  * values are heavy-tailed: Student-t with 3 degrees of freedom for weights
    (a few large entries carry much of the norm, which is what top-k exploits
    and what hurts quantizers), Laplace for batch-norm and bias vectors;
  * magnitudes sit where fp16 starts to lose the smallest entries (RMS about
    1e-4 .. 1e-2), as in mixed-precision training without loss scaling.
"""
from __future__ import annotations

import dataclasses

import numpy as np

STAGES = ((3, 64), (4, 128), (6, 256), (3, 512))  # (blocks, width)
EXPANSION = 4
NUM_CLASSES = 1000


@dataclasses.dataclass(frozen=True)
class Param:
    name: str
    shape: tuple[int, ...]
    kind: str  # "conv", "bn_weight", "bn_bias", "fc_weight" or "fc_bias"
    depth: float  # position in the network, 0 (input) .. 1 (classifier)

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


def _layers() -> list[tuple[str, str, tuple[int, ...]]]:
    """(name, kind, shape) of every parameter, in torchvision's order."""
    out: list[tuple[str, str, tuple[int, ...]]] = []

    def conv(name: str, cout: int, cin: int, k: int) -> None:
        out.append((f"{name}.weight", "conv", (cout, cin, k, k)))

    def bn(name: str, channels: int) -> None:
        out.append((f"{name}.weight", "bn_weight", (channels,)))
        out.append((f"{name}.bias", "bn_bias", (channels,)))

    conv("conv1", 64, 3, 7)
    bn("bn1", 64)
    channels = 64
    for stage, (blocks, width) in enumerate(STAGES, start=1):
        for block in range(blocks):
            prefix = f"layer{stage}.{block}"
            conv(f"{prefix}.conv1", width, channels, 1)
            bn(f"{prefix}.bn1", width)
            conv(f"{prefix}.conv2", width, width, 3)
            bn(f"{prefix}.bn2", width)
            conv(f"{prefix}.conv3", width * EXPANSION, width, 1)
            bn(f"{prefix}.bn3", width * EXPANSION)
            if block == 0:
                conv(f"{prefix}.downsample.0", width * EXPANSION, channels, 1)
                bn(f"{prefix}.downsample.1", width * EXPANSION)
            channels = width * EXPANSION
    out.append(("fc.weight", "fc_weight", (NUM_CLASSES, channels)))
    out.append(("fc.bias", "fc_bias", (NUM_CLASSES,)))
    return out


def parameters() -> list[Param]:
    layers = _layers()
    last = len(layers) - 1
    return [Param(name, shape, kind, i / last)
            for i, (name, kind, shape) in enumerate(layers)]


def _student_t(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Unit-variance Student-t (3 degrees of freedom) in float32."""
    dof = 3.0
    return (rng.standard_t(dof, size=shape) / np.sqrt(dof / (dof - 2))).astype(np.float32)


def synthetic_gradient(param: Param, rng: np.random.Generator) -> np.ndarray:
    """One tensor's gradient under the model in this module's docstring."""
    # Depth trend: 3e-4 at the stem to 3e-3 at the classifier, times a
    # per-layer log-normal factor.
    layer_rms = 3e-4 * 10.0 ** param.depth * rng.lognormal(0.0, 0.4)
    if param.kind in ("conv", "fc_weight"):
        rows = param.shape[0]
        row_scale = rng.lognormal(0.0, 0.7, size=rows).astype(np.float32)
        row_scale /= np.sqrt(np.mean(row_scale ** 2))
        values = _student_t(rng, param.shape)
        values *= row_scale.reshape((rows,) + (1,) * (len(param.shape) - 1))
        values *= np.float32(layer_rms)
        return values
    # Batch-norm and bias vectors sum over every position of a batch, so
    # their entries are larger than a weight's; Laplace has variance 2 b^2.
    return rng.laplace(0.0, 3 * layer_rms / np.sqrt(2), size=param.shape).astype(np.float32)


def synthetic_gradients(seed: int = 0) -> dict[str, np.ndarray]:
    """{name: float32 gradient} for every ResNet-50 parameter, reproducible by seed."""
    rng = np.random.default_rng(seed)
    return {p.name: synthetic_gradient(p, rng) for p in parameters()}
