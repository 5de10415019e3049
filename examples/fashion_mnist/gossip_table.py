"""Gossip training against all-reduce: 8 workers on a ring (issue 10).

    examples/fashion_mnist/run_gossip_table            # every row
    examples/fashion_mnist/run_gossip_table --rows ddp # some rows; the others
                                                       # stay as measured

Rows, with the same seed, data order, initial model, optimizer and epochs:
dense DDP (Gloo allreduce of the gradients), and decentralised training
through gradcomp.torch.hook's gossip mode on a ring (every worker with its
own gradcompd): PowerGossip rank 1 and exact gossip. Each row's results go
to docs/plots/gossip_training.json (rows run earlier are kept), and the
table of every row measured so far is printed as markdown.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import pathlib
import sys

import gradcomp
import train

REPO = pathlib.Path(__file__).resolve().parents[2]
JSON = REPO / "docs/plots/gossip_training.json"
WORKERS = 8
EPOCHS = 6

ROWS = {
    "ddp": ("all-reduce (DDP, Gloo)", train.RunSpec(comm="ddp")),
    "power1": ("gossip, PowerGossip rank 1", train.RunSpec(
        gossip=gradcomp.Gossip("ring", rank=1, power_steps=1, diffusion=1.308))),
    "exact": ("gossip, exact", train.RunSpec(
        gossip=gradcomp.Gossip("ring", rank=0, diffusion=1.0))),
}


def table(runs: dict) -> str:
    """The markdown table of the measured rows, all-reduce first."""
    lines = ["| row | averaged model accuracy | vs all-reduce (points) | "
             "per epoch (%) | workers' own accuracy, min-max (%) | relative "
             "consensus distance, per epoch | bytes sent per step per worker "
             "(KiB) | step time (ms) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    base = runs.get("ddp", {}).get("result", {}).get("accuracy", [None])[-1]
    for key in ROWS:
        if key not in runs:
            continue
        label, r = runs[key]["label"], runs[key]["result"]
        acc = r["accuracy"][-1]
        own = r["worker_accuracy"]
        lines.append(" | ".join([
            f"| {label}", f"{100 * acc:.2f} %",
            f"{100 * (acc - base):+.2f}" if base is not None else "-",
            ", ".join(f"{100 * a:.1f}" for a in r["accuracy"]),
            f"{100 * min(own):.2f}-{100 * max(own):.2f}" if own else "- (one model)",
            ", ".join(f"{d:.2e}" for d in r["relative_consensus_distance"]) or "0",
            f"{r['bytes_per_step'] / 1024:.1f}",
            f"{1000 * r['step_seconds']:.0f} |"]))
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", default=",".join(ROWS),
                   help=f"comma-separated, of {', '.join(ROWS)}")
    p.add_argument("--epochs", type=int, default=EPOCHS)
    p.add_argument("--workers", type=int, default=WORKERS)
    p.add_argument("--json", default=str(JSON))
    args = p.parse_args()
    keys = [k for k in args.rows.split(",") if k]
    unknown = sorted(set(keys) - set(ROWS))
    if unknown:
        p.error(f"--rows: unknown {unknown}; expected some of {', '.join(ROWS)}")
    path = pathlib.Path(args.json)
    runs = json.loads(path.read_text())["rows"] if path.exists() else {}
    for key in keys:
        label, spec = ROWS[key]
        spec = dataclasses.replace(spec, workers=args.workers, epochs=args.epochs)
        print(f"== {label}", flush=True)
        result = train.run(spec)
        print(f"   {json.dumps(dataclasses.asdict(result))}", flush=True)
        runs[key] = {"label": label, "result": dataclasses.asdict(result),
                     "spec": {k: v for k, v in dataclasses.asdict(spec).items()
                              if k != "hook_wrapper"},
                     "date": datetime.datetime.now(datetime.timezone.utc)
                     .strftime("%Y-%m-%d %H:%M UTC")}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"rows": runs}, indent=1))
    print(table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
