"""Plots bench/gossip_consensus.cc's CSV: consensus distance against bytes
sent per worker, one panel per topology, and prints the bytes each method
needs to reach a few distances (the table in docs/gossip.md). A third
argument, bench/gossip_consensus_daemons.cc's CSV (the same runs through 8
real daemons), adds those runs as markers and rows marked "(8 daemons)".

    /usr/bin/python3 bench/plot_gossip_consensus.py consensus.csv \
        docs/gossip_consensus.png [consensus_daemons.csv]
"""
import csv
import sys
from collections import defaultdict
from typing import Dict, List, Tuple

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

LEVELS = (1e-2, 1e-4, 1e-6)


def load(path: str) -> Dict[str, Dict[str, List[Tuple[float, float]]]]:
    runs: Dict[str, Dict[str, List[Tuple[float, float]]]] = defaultdict(
        lambda: defaultdict(list))
    with open(path) as f:
        for row in csv.DictReader(f):
            runs[row["topology"]][row["method"]].append(
                (float(row["bytes_per_worker"]), float(row["distance"])))
    return runs


def bytes_to(points: List[Tuple[float, float]], level: float) -> float:
    for b, d in points:
        if d <= level:
            return b
    return float("inf")


def main(argv: List[str]) -> int:
    runs = load(argv[1])
    if len(argv) > 3:
        for topology, methods in load(argv[3]).items():
            for method, points in methods.items():
                runs[topology][f"{method} (8 daemons)"] = points
    fig, axes = plt.subplots(1, len(runs), figsize=(6 * len(runs), 4.2))
    for ax, (topology, methods) in zip(axes, sorted(runs.items())):
        for method, points in sorted(methods.items()):
            daemons = method.endswith("(8 daemons)")
            ax.loglog([max(b, 1.0) for b, _ in points],
                      [d for _, d in points], label=method,
                      linestyle="none" if daemons else "-",
                      marker="." if daemons else None, markersize=3)
        ax.set_title(f"W = 8, {topology}, 64 x 64 random matrices")
        ax.set_xlabel("bytes sent per worker")
        ax.set_ylabel("consensus distance / initial")
        ax.set_ylim(1e-7, 2)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(argv[2], dpi=110)
    print("| topology | method | " +
          " | ".join(f"KB to {lv:g}" for lv in LEVELS) + " |")
    print("| --- | --- |" + " ---: |" * len(LEVELS))
    for topology, methods in sorted(runs.items()):
        for method, points in sorted(methods.items()):
            cells = []
            for lv in LEVELS:
                b = bytes_to(points, lv)
                cells.append("-" if b == float("inf") else f"{b / 1024:.1f}")
            print(f"| {topology} | {method} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
