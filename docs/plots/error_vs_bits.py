"""Plots relative L2 error against bits per value (docs/error_vs_bits.png).

The CSV comes from the rate-distortion tool (one step of each codec on 2^18
values of N(0, 1e-3^2); bits per value count the whole payload):

    bazel run //codecs/cpu:polar_rate_distortion_tool -- --csv \\
        > docs/plots/error_vs_bits.csv
    /usr/bin/python3 docs/plots/error_vs_bits.py \\
        [docs/plots/error_vs_bits.csv] [docs/error_vs_bits.png]
"""

import csv
import os
import sys
from collections import OrderedDict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
STYLE = {
    "polar": ("polar planes", "o-"),
    "polar seed": ("polar seed (published scheme)", "kx"),
    "qsgd": ("QSGD (unbiased)", "s-"),
    "sign": ("signSGD / EF-sign (1st step)", "D"),
    "topk": ("top-k", "^-"),
    "powersgd": ("PowerSGD rank 1..64, 512x512", "v-"),
    "randomk": ("random-k, scaled (unbiased)", "<--"),
    "randomk unscaled": ("random-k, unscaled", ">--"),
    "threshold": ("threshold, tau_rms 3..0.5", "p-"),
}


def main() -> None:
    src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        HERE, "error_vs_bits.csv")
    dst = sys.argv[2] if len(sys.argv) > 2 else os.path.join(
        HERE, "..", "error_vs_bits.png")
    families = OrderedDict()
    with open(src, encoding="utf-8") as f:
        for row in csv.DictReader(f):
            families.setdefault(row["family"], []).append(
                (float(row["bits_per_value"]), float(row["relative_l2_error"])))
    fig, ax = plt.subplots(figsize=(8, 5.5))
    for family, points in families.items():
        points.sort()
        label, fmt = STYLE.get(family, (family, "o-"))
        ax.plot([b for b, _ in points], [e for _, e in points], fmt,
                label=label, markersize=5)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("bits per value (whole payload / numel)")
    ax.set_ylabel("relative L2 error ||D(C(g)) - g|| / ||g||")
    ax.set_title("One step on 2^18 values of N(0, 1e-3^2)")
    ax.axhline(1.0, color="gray", linewidth=0.8, linestyle=":")
    ax.grid(True, which="both", linewidth=0.3)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    fig.savefig(dst, dpi=110)
    print(f"wrote {os.path.normpath(dst)}")


if __name__ == "__main__":
    main()
