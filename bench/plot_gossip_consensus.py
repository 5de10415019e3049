"""Plots bench/gossip_consensus.cc's CSV: consensus distance against bytes
sent per worker, one panel per data type and topology, and prints the
bytes each method needs to reach a few distances and PowerGossip's bytes as
a ratio to the best baseline's (the tables in docs/gossip.md). A third
argument, bench/gossip_consensus_daemons.cc's CSV (the same runs through 8
real daemons), adds those runs as markers and prints, per run, whether its
logged points equal the in-process ones. A CSV of several starts
(`gossip_consensus OUT --seeds=N`, data "random-seed<k>") also prints the
ratios' median and range over the starts. The matrices' side is read off
the CSV (Choco's smallest k is side / 2), so the 100 x 100 run
(`gossip_consensus OUT 100`) plots and tabulates the same way, and the
number of workers off the data's name ("random-w16": 16, else 8), for
`gossip_consensus OUT --workers=16`.

`--accounting=paper` recounts every run's bytes the way the paper's code
(epfml/powergossip) counts them, before plotting and tabulating: no message
headers (our 32 bytes per message), PowerGossip and exact gossip at 4
bytes per float, and Choco's top-k at 12 bytes per kept entry (an int64
index, torch.topk's, and an fp32 value) where our messages send 8 (uint32
index, fp32 value); it then also prints PowerGossip's ratios under both
counts side by side. `--accounting=bodies` drops only the headers (Choco
at our 8 bytes per entry), to separate the two effects. The default,
`--accounting=wire`, is the bytes the daemons send (docs/gossip.md, "Why
the paper's ring looks better").

    /usr/bin/python3 bench/plot_gossip_consensus.py consensus.csv \\
        docs/gossip_consensus.png [consensus_daemons.csv] \\
        [--accounting=wire|bodies|paper]
"""
import csv
import math
import sys
from collections import defaultdict
from typing import Dict, List, Tuple

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

LEVELS = (1e-2, 1e-4, 1e-6)
Points = List[Tuple[int, float, float]]  # step, bytes per worker, distance
Runs = Dict[Tuple[str, str], Dict[str, Points]]


def load(path: str) -> Tuple[Runs, Dict[Tuple[str, str, str], float]]:
    runs: Runs = defaultdict(lambda: defaultdict(list))
    gammas: Dict[Tuple[str, str, str], float] = {}
    with open(path) as f:
        for row in csv.DictReader(f):
            key = (row["data"], row["topology"])
            runs[key][row["method"]].append(
                (int(row["step"]), float(row["bytes_per_worker"]),
                 float(row["distance"])))
            gammas[key + (row["method"],)] = float(row["gamma"])
    return runs, gammas


def bytes_to(points: Points, level: float) -> float:
    for _, b, d in points:
        if d <= level:
            return b
    return float("inf")


def side_of(runs: Runs) -> int:
    """The matrices' side: Choco's smallest k is (rows + cols) / 4."""
    return 2 * min(int(m[len("choco-k"):]) for methods in runs.values()
                   for m in methods if m.startswith("choco-k"))


def label(method: str, gamma: float, side: int) -> str:
    if method.startswith("choco-k"):
        k = int(method[len("choco-k"):])
        match = {side // 2: " (= r1 bytes)", side: " (= r2 bytes)"}
        return (f"Choco top-{k}{match.get(k, ' (5 %)')}, "
                f"gamma {gamma:.3g}")
    if method.startswith("powergossip-r"):
        rank = method[len("powergossip-r"):].split("-")[0]
        how = "tuned" if method.endswith("-tuned") else "paper's"
        cold = ", no warm start" if "-cold" in method else ""
        return f"PowerGossip r = {rank}{cold}, diffusion {gamma:.3g} ({how})"
    return f"exact gossip, diffusion {gamma:.3g}"


def kb(b: float) -> str:
    return "not reached" if b == float("inf") else f"{b / 1024:.1f}"


def ratios(methods: Dict[str, Points], pg: str) -> List[float]:
    """pg's bytes / the best baseline's at each level (inf: pg never
    reaches it; nan: no baseline does)."""
    out = []
    for lv in LEVELS:
        base = min(bytes_to(p, lv) for m, p in methods.items()
                   if not m.startswith("powergossip"))
        mine = bytes_to(methods[pg], lv)
        out.append(float("inf") if mine == float("inf") else
                   float("nan") if base == float("inf") else mine / base)
    return out


def message_bytes(method: str, side: int) -> Dict[str, int]:
    """The bytes of one message of `method` on side x side matrices, by
    accounting: "wire", as our daemons send it (a 32-byte header, then the
    body); "bodies", the body only; "paper", as the paper's code counts it
    (num_bits(buffer) / 8 of the buffers it sends: fp32 values, and for
    top-k also the int64 indices of torch.topk)."""
    if method.startswith("choco-k"):
        k = int(method[len("choco-k"):])
        return {"wire": 32 + 8 * k, "bodies": 8 * k, "paper": 12 * k}
    if method.startswith("powergossip-r"):
        rank = min(int(method[len("powergossip-r"):].split("-")[0]), side)
        body = 4 * rank * side
    else:
        body = 4 * side * side
    return {"wire": 32 + body, "bodies": body, "paper": body}


def recount(runs: Runs, side: int, accounting: str) -> Runs:
    """`runs` with every point's bytes recounted by `accounting` (see
    message_bytes): the messages sent (bytes / our bytes per message, every
    message of a run being the same size) times that count's bytes per
    message."""
    out: Runs = defaultdict(lambda: defaultdict(list))
    for key, methods in runs.items():
        for method, points in methods.items():
            sizes = message_bytes(method, side)
            wire, paper = sizes["wire"], sizes[accounting]
            for step, b, d in points:
                messages = b / wire
                if abs(messages - round(messages)) > 1e-6 * max(messages, 1):
                    raise ValueError(
                        f"{key} {method} step {step}: {b} bytes per worker is "
                        f"not a whole number of {wire}-byte messages; the "
                        "paper's count needs the CSV of "
                        "bench/gossip_consensus.cc on square matrices")
                out[key][method].append((step, round(messages) * paper, d))
    return out


def print_header(columns: List[str], level_label: str) -> None:
    """A markdown table's header: `columns`, then one right-aligned column
    per distance in LEVELS, named `level_label` and the distance."""
    print("| " + " | ".join(columns) + " | " +
          " | ".join(f"{level_label}{lv:g}" for lv in LEVELS) + " |")
    print("|" + " --- |" * len(columns) + " ---: |" * len(LEVELS))


def print_seed_spread(runs: Runs) -> None:
    """For runs from several starts (data "random-seed<k>"): per topology
    and PowerGossip method, the ratio to the best baseline at each level
    as the median and range over the starts, and how many starts it wins
    (ratio < 1)."""
    by: Dict[Tuple[str, str], List[List[float]]] = defaultdict(list)
    seeds = sorted({data for data, _ in runs})
    for (data, topology), methods in runs.items():
        for pg in methods:
            if pg.startswith("powergossip"):
                by[(topology, pg)].append(ratios(methods, pg))
    print()
    print(f"Over {len(seeds)} starts ({', '.join(seeds)}): PowerGossip's "
          "bytes / the best baseline's, median [min, max], wins")
    print_header(["topology", "method"], "to ")
    for (topology, pg), rows in sorted(by.items()):
        cells = []
        for i in range(len(LEVELS)):
            vals = sorted(r[i] for r in rows)
            median = vals[len(vals) // 2] if len(vals) % 2 else \
                (vals[len(vals) // 2 - 1] + vals[len(vals) // 2]) / 2
            wins = sum(v < 1 for v in vals)
            cells.append(f"{median:.2f} [{vals[0]:.2f}, {vals[-1]:.2f}], "
                         f"{wins}/{len(vals)}")
        print(f"| {topology} | {pg} | " + " | ".join(cells) + " |")


def main(argv: List[str]) -> int:
    accounting = "wire"
    for arg in [a for a in argv if a.startswith("--accounting=")]:
        accounting = arg[len("--accounting="):]
        argv.remove(arg)
    if accounting not in ("wire", "bodies", "paper") or len(argv) < 3:
        print("usage: plot_gossip_consensus.py CONSENSUS.csv OUT.png "
              "[DAEMONS.csv] [--accounting=wire|bodies|paper]",
              file=sys.stderr)
        return 2
    runs, gammas = load(argv[1])
    daemons: Runs = load(argv[3])[0] if len(argv) > 3 else {}
    side = side_of(runs)
    wire_runs = runs
    if accounting != "wire":
        runs = recount(runs, side, accounting)
        daemons = recount(daemons, side, accounting) if daemons else {}
    keys = sorted(runs)
    nrows = (len(keys) + 1) // 2
    fig, axes = plt.subplots(nrows, 2, figsize=(13, 4.5 * nrows),
                             squeeze=False)
    for ax in axes.flat[len(keys):]:
        ax.set_visible(False)
    for ax, key in zip(axes.flat, keys):
        ax.set_prop_cycle(color=plt.cm.tab20.colors)  # > 10 methods
        for method, points in sorted(runs[key].items()):
            line, = ax.loglog([max(b, 1.0) for _, b, _ in points],
                              [d for _, _, d in points],
                              label=label(method, gammas[key + (method,)],
                                          side),
                              linestyle="--" if method.startswith(
                                  "powergossip") and not method.endswith(
                                      "-tuned") else "-")
            dpoints = daemons.get(key, {}).get(method)
            if dpoints:
                ax.loglog([max(b, 1.0) for _, b, _ in dpoints],
                          [d for _, _, d in dpoints], linestyle="none",
                          marker=".", markersize=3, color=line.get_color())
        data, topology = key
        workers = data.split("-w")[1] if "-w" in data else "8"
        ax.set_title(f"W = {workers}, {topology}, {data} {side} x {side}"
                     + (" (dots: 8 daemons)" if daemons else ""))
        ax.set_xlabel("bytes sent per worker" +
                      {"wire": "", "bodies": " (no headers)",
                       "paper": " (the paper's count)"}[accounting])
        ax.set_ylabel("consensus distance / initial")
        ax.set_ylim(1e-7, 2)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(argv[2], dpi=100)

    print_header(["data", "topology", "method"], "KB to ")
    for key in keys:
        for method, points in sorted(runs[key].items()):
            cells = [kb(bytes_to(points, lv)) for lv in LEVELS]
            print(f"| {key[0]} | {key[1]} | "
                  f"{label(method, gammas[key + (method,)], side)} | "
                  + " | ".join(cells) + " |")
    print()
    print("PowerGossip's bytes / the best baseline's (exact gossip or any "
          "Choco run), < 1: PowerGossip needs fewer")
    print_header(["data", "topology", "method"], "to ")
    for key in keys:
        methods = runs[key]
        for pg in sorted(m for m in methods
                         if m.startswith("powergossip")):
            cells = ["-" if r == float("inf") else
                     "inf (no baseline)" if math.isnan(r) else f"{r:.2f}"
                     for r in ratios(methods, pg)]
            print(f"| {key[0]} | {key[1]} | "
                  f"{label(pg, gammas[key + (pg,)], side)} | "
                  + " | ".join(cells) + " |")
    if accounting != "wire":
        print()
        print(f"PowerGossip's bytes / the best baseline's, {accounting} "
              "count / ours (wire)")
        print_header(["data", "topology", "method"], "to ")
        for key in keys:
            for pg in sorted(m for m in runs[key]
                             if m.startswith("powergossip")):
                paper = ratios(runs[key], pg)
                wire = ratios(wire_runs[key], pg)
                print(f"| {key[0]} | {key[1]} | "
                      f"{label(pg, gammas[key + (pg,)], side)} | "
                      + " | ".join(f"{p:.2f} / {w:.2f}"
                                   for p, w in zip(paper, wire)) + " |")
    if any("-seed" in data for data, _ in keys):
        print_seed_spread(runs)
    if daemons:
        print()
        for key in sorted(daemons):
            for method, dpoints in sorted(daemons[key].items()):
                mine = runs.get(key, {}).get(method)
                same = mine == dpoints
                print(f"{key[0]} {key[1]} {method}: {len(dpoints)} logged "
                      f"points through daemons, "
                      + ("identical to in-process" if same else
                         "DIFFERENT from in-process"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
