"""The convergence table: every row trained once per seed, same seeds and
epochs for every row.

    examples/fashion_mnist/run_table --seeds 3  # writes docs/convergence.md
                                                # and docs/convergence.png

Rows (W workers, each with its own gradcompd for the gradcomp rows): dense
DDP (Gloo allreduce), gradcomp.torch.hook with none, topk 1 % (DGC momentum
correction and warm-up), powersgd rank 2, efsign, qsgd 4-bit, and PyTorch's
own powerSGD_hook rank 2. The raw results also go to
docs/plots/convergence.json, from which --plot_only redraws the page.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import pathlib
import statistics
import sys
import textwrap
import time

import train

REPO = pathlib.Path(__file__).resolve().parents[2]
DEFAULT_EPOCHS = 8
DEFAULT_WORKERS = 4
# The row every other is compared with.
DENSE_LABEL = "dense DDP (Gloo allreduce)"


def rows(steps_per_epoch: int) -> list[tuple[str, train.RunSpec, str]]:
    """(label, spec, settings) of every row; the optimizer's hyper-parameters
    are the RunSpec's, the same for every row.

    Every compressing row warms up over the first epoch: dense steps (the
    policy's warmup_steps; powerSGD_hook's start_powerSGD_iter) or, for DGC,
    its own schedule of falling density.
    """
    gc = train.codec_policy
    warm = steps_per_epoch
    # DGC's warm-up: 4 stages of rising sparsity over the first epoch.
    stage = max(steps_per_epoch // 4, 1)
    return [
        (DENSE_LABEL, train.RunSpec(comm="ddp"),
         "DDP's own Gloo allreduce of the fp32 gradient."),
        ("gradcomp none", train.RunSpec(policy=gc("none")),
         "the hook, every tensor through the `none` codec (dense fp32 sums in "
         "the daemons)."),
        ("gradcomp topk 1 % (DGC)", train.RunSpec(
            policy=gc("topk", {"ratio": 0.01, "warmup_steps_per_stage": stage}),
            codec_momentum=True),
         f"`topk` ratio 0.01 with DGC's momentum correction (momentum 0.9, "
         f"masking on; the optimizer applies no momentum to these tensors) "
         f"and DGC's warm-up, densities 25 %, 6.25 %, 1.56 % and 1 % (the "
         f"0.4 % stage is below the ratio, so it sends the ratio's 1 %), "
         f"{stage} steps each (the first epoch), then 1 %; tensors under "
         f"{train.DENSE_BELOW_NUMEL} values and 1-D tensors dense."),
        ("gradcomp powersgd rank 2", train.RunSpec(
            policy=gc("powersgd", {"rank": 2}, warmup_steps=warm,
                      dense_below_numel=0)),
         f"`powersgd` rank 2 (warm start, error feedback, "
         f"min_compression_rate 2), dense for the first {warm} steps (one "
         f"epoch, policy warmup_steps); no size threshold in the policy "
         f"(dense_below_numel 0), so the codec's min_compression_rate picks "
         f"the tensors, as in powerSGD_hook: all four weight matrices; 1-D "
         f"tensors dense."),
        ("gradcomp efsign", train.RunSpec(
            policy=gc("efsign", {"bucket": 64}, warmup_steps=warm)),
         f"`efsign` (EF-signSGD) with one scale per 64 values (`bucket` 64) "
         f"instead of one per tensor, dense for the first {warm} steps; "
         f"tensors under {train.DENSE_BELOW_NUMEL} values and 1-D tensors "
         f"dense."),
        ("gradcomp qsgd 4-bit", train.RunSpec(
            policy=gc("qsgd", {"bits": 4, "bucket": 64}, warmup_steps=warm)),
         f"`qsgd` 4 bits (7 levels) with one norm per 64 values (`bucket` 64; "
         f"the default 512 has a variance bound 2.8 times higher), dense for "
         f"the first {warm} steps; tensors under {train.DENSE_BELOW_NUMEL} "
         f"values and 1-D tensors dense."),
        ("PyTorch powerSGD_hook rank 2", train.RunSpec(
            comm="torch_powersgd", powersgd_start_iter=warm),
         f"`powerSGD_hook` rank 2 (warm start, error feedback, "
         f"min_compression_rate 2), start_powerSGD_iter {warm} (one epoch, "
         f"the same dense warm-up as gradcomp's powersgd row)."),
    ]


def _kib(n: float) -> str:
    return f"{n / 1024:.1f}"


def _mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    mean = statistics.fmean(values)
    return mean, statistics.stdev(values) if len(values) > 1 else 0.0


def _points(values: list[float]) -> str:
    """Accuracies as points, mean ± std (no std for one value)."""
    mean, std = _mean_std([100 * v for v in values])
    return f"{mean:.2f} ± {std:.2f}" if len(values) > 1 else f"{mean:.2f}"


def _finals(run: dict) -> list[float]:
    return [r["accuracy"][-1] for r in run["results"]]


def _mean_of(run: dict, key: str) -> float:
    return statistics.fmean(r[key] for r in run["results"])


# Generated sections; any other "## " section already on the page (added by
# hand, e.g. another experiment's) is kept, after these.
_GENERATED_SECTIONS = ("Each row's settings", "PowerSGD: gradcomp against PyTorch",
                       "How to read it")


def _kept_sections(out_md: pathlib.Path) -> list[str]:
    if not out_md.exists():
        return []
    parts = out_md.read_text().split("\n## ")[1:]
    return ["## " + part.rstrip("\n") for part in parts
            if part.split("\n", 1)[0].strip() not in _GENERATED_SECTIONS]


def _powersgd_verdict(runs: dict) -> list[str]:
    """The comparison of gradcomp's PowerSGD with powerSGD_hook, seed by seed."""
    ours_run = runs.get("gradcomp powersgd rank 2")
    theirs_run = runs.get("PyTorch powerSGD_hook rank 2")
    if ours_run is None or theirs_run is None:
        return ["PowerSGD rank 2: not compared (a row is missing)."]
    theirs_by_seed = dict(zip(theirs_run["seeds"], _finals(theirs_run)))
    pairs = [(seed, ours, theirs_by_seed[seed])
             for seed, ours in zip(ours_run["seeds"], _finals(ours_run))
             if seed in theirs_by_seed]
    ours_std = _mean_std([100 * o for _, o, _ in pairs])[1]
    theirs_std = _mean_std([100 * t for _, _, t in pairs])[1]
    diffs = [100 * (o - t) for _, o, t in pairs]
    diff_mean, diff_std = _mean_std(diffs)
    spread = max(ours_std, theirs_std)
    # Same seed, same initial model and data order: the differences are
    # paired. A 95 % interval for their mean (Student's t, n - 1 degrees of
    # freedom) says whether the seeds tell the two apart.
    n = len(pairs)
    interval = None
    if n > 1:
        from scipy import stats
        half = stats.t.ppf(0.975, n - 1) * diff_std / math.sqrt(n)
        interval = (diff_mean - half, diff_mean + half)
    below = sum(d < 0 for d in diffs)
    # The same test on either side of 0: a positive mean on noisy seeds is
    # no more a result than a negative one (the verdict said "target met"
    # for any mean >= 0).
    if interval is None:
        verdict = (f"{'worse' if diff_mean < 0 else 'no worse'} by "
                   f"{abs(diff_mean):.2f} points on one seed, which cannot "
                   f"tell this from noise")
    else:
        ratio = (f"{abs(diff_mean) / spread:.1f} times" if spread > 0
                 else "against")
        size = (f"{'worse' if diff_mean < 0 else 'better'} on the mean by "
                f"{abs(diff_mean):.2f} points, {ratio} the larger "
                f"seed-to-seed standard deviation ({spread:.2f}); gradcomp "
                f"below on {below} of {n} seeds; 95 % interval of the mean "
                f"paired difference [{interval[0]:+.2f}, {interval[1]:+.2f}]")
        if interval[1] < 0:
            verdict = (f"{size}: below 0, so gradcomp is worse beyond the "
                       f"noise of {n} seeds, target missed")
        elif interval[0] > 0:
            verdict = (f"{size}: above 0, so gradcomp is better beyond the "
                       f"noise of {n} seeds, target met")
        else:
            verdict = (f"{size}: it holds 0, so the {n} seeds do not tell "
                       f"the two apart (not shown worse: the target holds "
                       f"within this noise)")
    text = (f"PowerSGD rank 2 over {len(pairs)} seed(s): gradcomp "
            f"{_points([o for _, o, _ in pairs])} % against PyTorch's "
            f"powerSGD_hook {_points([t for _, _, t in pairs])} %; "
            f"gradcomp minus PyTorch, seed by seed: "
            f"{', '.join(f'{d:+.2f}' for d in diffs)} "
            f"(mean {diff_mean:+.2f} ± {diff_std:.2f}): {verdict}.")
    return textwrap.wrap(text, width=76)


def _seeds_flag(seeds: list[int]) -> str:
    """--seeds as given: a count for 0 .. N-1, else the list."""
    return (str(len(seeds)) if seeds == list(range(len(seeds)))
            else ",".join(map(str, seeds)))


def _same_seeds(results: dict) -> tuple[list[dict], list[int], str]:
    """The rows restricted to the seeds every row has, those seeds, and a
    note on the results left out (a run cut short ends within a seed)."""
    runs = results["rows"]
    seeds = [s for s in results["seeds"] if all(s in run["seeds"] for run in runs)]
    extra = [f"{run['label']} (seed {', '.join(str(s) for s in run['seeds'] if s not in seeds)})"
             for run in runs if len(run["seeds"]) > len(seeds)]
    kept = [{**run, "seeds": seeds,
             "results": [r for s, r in zip(run["seeds"], run["results"]) if s in seeds]}
            for run in runs]
    note = (f"Left out so that every row has the same seeds (the run ended "
            f"before the other rows of that seed): {', '.join(extra)}."
            if extra else "")
    unfinished = [str(s) for s in results["seeds"] if s not in seeds]
    if unfinished:
        note = (f"The run ended before every row had seed(s) "
                f"{', '.join(unfinished)}: this page reports seed(s) "
                f"{', '.join(map(str, seeds))} only. " + note)
    return kept, seeds, note


def write_page(results: dict, out_md: pathlib.Path, out_png: pathlib.Path) -> None:
    """docs/convergence.md and its plot from the results document."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs, seeds, left_out = _same_seeds(results)
    epochs = len(runs[0]["results"][0]["accuracy"])
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run in runs:
        per_epoch = [[100 * r["accuracy"][e] for r in run["results"]]
                     for e in range(epochs)]
        x = range(1, epochs + 1)
        line, = ax.plot(x, [statistics.fmean(v) for v in per_epoch], marker="o",
                        label=run["label"])
        if len(run["results"]) > 1:
            ax.fill_between(x, [min(v) for v in per_epoch],
                            [max(v) for v in per_epoch],
                            color=line.get_color(), alpha=0.12, linewidth=0)
    ax.set_xlabel("epoch")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"Fashion-MNIST, W = {results['workers']}: " + (
        f"mean over {len(seeds)} seeds (band: lowest to highest)"
        if len(seeds) > 1 else f"seed {seeds[0]}"))
    ax.set_xticks(range(1, epochs + 1))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)

    spec = results["spec"]
    transports = " and ".join(sorted({
        {"shm": "shared memory", "inline": "inline bytes"}[r["transport"]]
        for run in runs for r in run["results"] if r["transport"]}))
    if not runs or runs[0]["label"] != DENSE_LABEL:
        raise ValueError(
            f"the page compares every row with '{DENSE_LABEL}', which the "
            f"results do not hold first (rows: "
            f"{', '.join(run['label'] for run in runs)}); --rows results print "
            f"their PowerSGD comparison instead")
    dense_finals = dict(zip(runs[0]["seeds"], _finals(runs[0])))
    lines = [
        "# Convergence: compressed training against dense",
        "",
        "Produced by one command, one run (every row below comes from the same",
        "invocation, with the same seeds, and for each seed the same data order,",
        "initial model and epochs):",
        "",
        "```",
        "examples/fashion_mnist/run_table" + "".join(
            f" --{flag} {value}" for flag, value, default in
            (("epochs", spec["epochs"], DEFAULT_EPOCHS),
             ("workers", results["workers"], DEFAULT_WORKERS),
             ("seeds", _seeds_flag(results["seeds"]), "1"))
            if value != default),
        "```",
        "",
        *textwrap.wrap(
            f"What ran: Fashion-MNIST (Debian's dataset-fashion-mnist, 60,000 "
            f"training and 10,000 test images), the CNN of "
            f"`examples/fashion_mnist/train.py` ({results['parameters']:,} "
            f"parameters), W = {results['workers']} worker processes on one "
            f"{results['cores']}-core machine shared with other work, each with "
            f"its own `gradcompd` for the gradcomp rows (peered over loopback), "
            f"DDP on Gloo for set-up. {spec['epochs']} epochs, {results['steps']} "
            f"steps, batch {spec['batch_size']} per worker, SGD lr {spec['lr']} "
            f"(linear warm-up over a quarter epoch, then cosine decay to 0), "
            f"momentum {spec['momentum']}, seeds "
            f"{', '.join(map(str, seeds))} (each seed sets the initial model, "
            f"the data order, the daemons' Philox seed and powerSGD_hook's "
            f"random_seed). The hook passed gradients to its daemon through "
            f"{transports}. Run on {results['date']}, "
            f"{results['wall_minutes']:.0f} minutes.", width=76),
        "",
        *textwrap.wrap(
            "Accuracy: final test accuracy, mean ± sample standard deviation "
            "over the seeds, and each seed's; vs dense: the mean of the "
            "seed-by-seed differences from the dense row; per epoch: the mean "
            "over the seeds. Bytes, step time and CPU: means over the seeds.",
            width=76),
        "",
        "| row | final test accuracy (%) | per seed (%) | vs dense (points) | per epoch (%) | payload per step, all steps (KiB) | after epoch 1 (KiB) | dense payload / payload after epoch 1 | step time (ms) | CPU per step (ms) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    vs_dense = {}
    for run in runs:
        finals = _finals(run)
        diffs = [f - dense_finals[s] for s, f in zip(run["seeds"], finals)
                 if s in dense_finals]
        vs_dense[run["label"]] = statistics.fmean(diffs) if diffs else None
        per_epoch = [statistics.fmean(r["accuracy"][e] for r in run["results"])
                     for e in range(epochs)]
        later = _mean_of(run, "bytes_per_step_after_epoch1")
        # A run of one epoch has no steps after the first.
        ratio = (f"{_mean_of(run, 'raw_bytes_per_step') / later:.1f}" if later
                 else "-")
        lines.append(
            f"| {run['label']} | {_points(finals)} | "
            f"{' / '.join(f'{100 * f:.2f}' for f in finals)} | "
            f"{100 * vs_dense[run['label']]:+.2f} | "
            f"{', '.join(f'{100 * a:.1f}' for a in per_epoch)} | "
            f"{_kib(_mean_of(run, 'bytes_per_step'))} | "
            f"{_kib(later) if later else '-'} | {ratio} | "
            f"{1000 * _mean_of(run, 'step_seconds'):.1f} | "
            f"{1000 * _mean_of(run, 'cpu_seconds_per_step'):.1f} |")
    by_label = {run["label"]: run for run in runs}
    # A run cut short (its JSON is saved after every row) lacks some rows.
    missing = [label for label, _, _ in rows(1) if label not in by_label]
    # Within 0.5 points: on the mean, no more than 0.5 below dense (above is
    # no miss).
    within = [run["label"] for run in runs[1:]
              if vs_dense[run["label"]] >= -0.005 - 1e-9]
    outside = [run["label"] for run in runs[1:] if run["label"] not in within]
    none_std = (_mean_std([100 * f for f in _finals(by_label["gradcomp none"])])[1]
                if "gradcomp none" in by_label else None)
    lines += [
        "",
        *textwrap.wrap(
            f"Within 0.5 points of dense (on the mean over the seeds): "
            f"{', '.join(within) or 'none'}.", width=76),
        *textwrap.wrap(f"Not within 0.5 points: {', '.join(outside) or 'none'}.",
                       width=76),
        *textwrap.wrap(f"Not run (the run ended before them): {', '.join(missing)}.",
                       width=76) * bool(missing),
        *textwrap.wrap(left_out, width=76),
        "",
        *_powersgd_verdict(by_label),
        "",
        *(textwrap.wrap(
            f"The scale of the noise: dense DDP's final accuracy has a "
            f"standard deviation of "
            f"{_mean_std([100 * f for f in dense_finals.values()])[1]:.2f} "
            f"points over the seeds"
            + (f", gradcomp none's (the same average as dense up to the "
               f"order of fp32 additions) {none_std:.2f}" if none_std is not None
               else "") + ".", width=76) + [""] if len(seeds) > 1 else []),
        "![test accuracy against epoch, every row: mean over the seeds](convergence.png)",
        "",
        "## Each row's settings",
        "",
        *[line for run in runs for line in textwrap.wrap(
            f"- {run['label']}: {run['settings']}", width=76,
            subsequent_indent="  ")],
        "",
        *textwrap.wrap(
            f"Every compressing row warms up over the first epoch "
            f"({100 / spec['epochs']:.1f} % of the steps): densely, as "
            f"PyTorch's powerSGD_hook documents for its start_powerSGD_iter "
            f"(about 10 % of training), or, for topk, with DGC's own warm-up "
            f"of falling density. An earlier table (8 epochs, seed 0 only) "
            f"compressed from step 0 (powerSGD_hook from step 2), with one "
            f"efsign scale per tensor and qsgd's 512-value buckets: efsign "
            f"ended 1.07 points and qsgd 4-bit 0.56 points below dense, "
            f"topk 0.52, powersgd 0.31, powerSGD_hook 0.16.", width=76),
        "",
        "## PowerSGD: gradcomp against PyTorch",
        "",
        "The two rows run the same algorithm with the same settings: rank 2,",
        "error feedback, warm start, min_compression_rate 2, the same four",
        "weight matrices (each viewed as shape[0] x the rest; 1-D tensors",
        "dense) and the same dense first epoch. `codecs/cpu/powersgd.cc` was",
        "compared with torch 1.13's `powerSGD_hook.py` point by point: the",
        "residual is M - P_hat Q_mean^T with M = g + e; Q is the last step's",
        "mean Q (warm start), orthonormalised before use; P is summed and",
        "orthonormalised (Gram-Schmidt, column by column, no epsilon); Q is",
        "summed and divided by W; 1-D tensors go dense in both (PyTorch also",
        "keeps a residual for its dense tensors, g - mean(g), whose mean over",
        "the workers is zero, so the average is the same). Given the same first",
        "Q, the codec's output equals the hook's step after step to fp32",
        "accuracy: `codecs/cpu/powersgd_torch_test.py` (run by `bazel test",
        "//codecs/cpu/...`) checks it over several steps at rank 2 and 4. What",
        "differs, none of it a worse choice on gradcomp's side: the random",
        "first Q (Philox normals keyed by seed, tensor and step against",
        "torch.randn from the state's RandomState), drawn once per tensor when",
        "compression starts; gradcomp orthonormalises in double with a second",
        "projection pass, PyTorch in fp32 with one; gradcomp restarts a tensor",
        "from a random Q if its warm start has an all-zero column, where",
        "PyTorch would divide by zero; PyTorch runs one P and one Q allreduce",
        "per DDP bucket, gradcomp two summed rounds per tensor. No change to",
        "the codec was needed.",
        "",
        "## How to read it",
        "",
        "- Payload per step: what one worker's exchange carries once, summed",
        "  over every tensor, as a mean over all steps and over the steps after",
        "  the first epoch (after every row's warm-up: the compressed regime,",
        "  which the ratio column uses). gradcomp rows: the daemon's own",
        "  `wire_bytes` (every round's payload, headers included) as the hook",
        "  counts them. Dense DDP: the fp32 gradient. PyTorch's powerSGD_hook:",
        "  the bytes of every tensor it allreduces (P, Q, and its uncompressed",
        "  tensors). What a worker sends is a multiple of it that depends on",
        "  the collective: a ring allreduce (Gloo, and powerSGD_hook's",
        "  allreduces) sends 2 (W-1)/W = 1.5 times it at W = 4, while the",
        "  daemons send a GATHER round's payload (topk, efsign, qsgd) and the",
        "  hook's batched rounds (PowerSGD's P and Q travel in the bucket's",
        "  batch as one GATHER message) to each of the W - 1 peers, 3 times it",
        "  at W = 4 (a review measured `gradcomp_peer_bytes_total` at 3.0",
        "  times `wire_bytes` for topk, qsgd and powersgd, 1.6 times for",
        "  none). So on the wire the ratio column is about twice what the",
        "  compressed rows save against dense Gloo, and gradcomp's PowerSGD",
        "  sends about twice powerSGD_hook's bytes at W = 4; the sharded",
        "  aggregation (docs/peers.md) sends about 2 (W-1)/W instead.",
        "- Tensors that go dense (1-D tensors in every row; in the topk,",
        "  efsign and qsgd rows also tensors under 1024 values, the daemon's",
        "  default policy thresholds) bound the ratio: this model is small.",
        "- gradcomp none computes the same average as Gloo's allreduce up to",
        "  the order of fp32 additions, yet its trajectory drifts from dense",
        "  (rounding differences grow over the steps); its distance from dense",
        "  and the seed-to-seed spread of every row are the scale against",
        "  which to read the other rows. A handful of seeds is what the shared",
        "  2-core machine had time for: differences of a few tenths of a point",
        "  between rows are within that noise.",
        "- Every row uses the dense row's hyper-parameters (lr, momentum,",
        "  schedule), tuned for none of the codecs.",
        "- Step time is the mean wall time of forward, backward, gradient",
        "  exchange and update on rank 0, the first 10 steps left out; with",
        "  W = 4 workers and 4 daemons on 2 shared cores it measures CPU",
        "  contention as much as communication. CPU per step is rank 0's",
        "  process (all threads) plus its daemon, per step: the steadier",
        "  figure of what the exchange costs. Until 2026-12-07 the daemon's",
        "  share was its CPU over the whole run (evaluation and the gaps",
        "  between steps included) divided by the steps, which overstated the",
        "  gradcomp rows; `train.py` now counts the daemon within the steps",
        "  alone, as it counts the trainer (the table's date says which). The",
        "  hook's overhead against powerSGD_hook is discussed in",
        "  docs/benchmarks.md.",
    ]
    kept = _kept_sections(out_md)
    out_md.write_text("\n".join(lines + [""] + ["\n\n".join(kept), ""] * bool(kept)))


def parse_seeds(text: str) -> list[int]:
    """--seeds: a count N (seeds 0 .. N-1) or a comma-separated list."""
    try:
        seeds = ([int(v) for v in text.split(",")] if "," in text
                 else list(range(int(text))))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--seeds {text!r}: expected a count (3) or a list (0,1,2)") from None
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise argparse.ArgumentTypeError(
            f"--seeds {text!r}: expected at least one seed, none repeated or "
            f"negative")
    return seeds


def main() -> int:
    p = argparse.ArgumentParser(description="the convergence table")
    p.add_argument("--epochs", type=int, default=DEFAULT_EPOCHS)
    p.add_argument("--workers", type=int, default=DEFAULT_WORKERS)
    p.add_argument("--seeds", type=parse_seeds, default=[0],
                   help="a count N (seeds 0 .. N-1) or a list (0,1,2): every "
                        "row trains once with each seed (default: seed 0)")
    p.add_argument("--json", default=None,
                   help="results file (default: docs/plots/convergence.json, "
                   "or with --rows /tmp/gradcomp-convergence-rows.json, so that "
                   "a partial run never replaces the page's results)")
    p.add_argument("--md", default=str(REPO / "docs/convergence.md"))
    p.add_argument("--png", default=str(REPO / "docs/convergence.png"))
    p.add_argument("--plot_only", action="store_true",
                   help="redraw the page from --json without training")
    p.add_argument("--rows", default="",
                   help="train only the rows whose label holds one of these "
                        "comma-separated words (e.g. 'powersgd,powerSGD'); "
                        "writes --json and prints the PowerSGD comparison, "
                        "not the page, which needs every row")
    args = p.parse_args()
    words = [w for w in args.rows.split(",") if w]
    json_path = pathlib.Path(args.json or (
        "/tmp/gradcomp-convergence-rows.json" if words
        else REPO / "docs/plots/convergence.json"))
    if not args.plot_only:
        x_train, _ = train.load_split("train")
        base = train.RunSpec(workers=args.workers, epochs=args.epochs)
        steps_per_epoch = len(x_train) // (base.batch_size * args.workers)
        start = time.monotonic()
        selected = [row for row in rows(steps_per_epoch)
                    if not words or any(w in row[0] for w in words)]
        runs = [{"label": label, "settings": settings,
                 "spec": {k: v for k, v in dataclasses.asdict(
                     dataclasses.replace(spec, workers=args.workers,
                                         epochs=args.epochs)).items()
                          if k not in ("hook_wrapper", "seed")},
                 "seeds": [], "results": []}
                for label, spec, settings in selected]
        json_path.parent.mkdir(parents=True, exist_ok=True)
        # Seed by seed, every row within a seed: a run cut short leaves whole
        # seeds, every row with the same number of them.
        for seed in args.seeds:
            for run, (label, spec, _) in zip(runs, selected):
                spec = dataclasses.replace(spec, workers=args.workers,
                                           epochs=args.epochs, seed=seed)
                print(f"== {label}, seed {seed}", flush=True)
                result = train.run(spec)
                print(f"   {json.dumps(dataclasses.asdict(result))}", flush=True)
                run["seeds"].append(seed)
                run["results"].append(dataclasses.asdict(result))
                # Saved after every row, so that a run cut short still leaves
                # what it measured for --plot_only.
                json_path.write_text(json.dumps({
                    "workers": args.workers, "cores": os.cpu_count(),
                    "parameters": sum(p.numel() for p in train.Net().parameters()),
                    "steps": args.epochs * steps_per_epoch,
                    "seeds": args.seeds, "spec": runs[0]["spec"],
                    "rows": [run for run in runs if run["results"]],
                    "date": datetime.datetime.now(datetime.timezone.utc).strftime(
                        "%Y-%m-%d %H:%M UTC"),
                    "wall_minutes": (time.monotonic() - start) / 60,
                }, indent=1))
    if words:
        results = json.loads(json_path.read_text())
        print("\n".join(_powersgd_verdict(
            {run["label"]: run for run in results["rows"]})))
        print(f"wrote {json_path}")
        return 0
    write_page(json.loads(json_path.read_text()), pathlib.Path(args.md),
               pathlib.Path(args.png))
    print(f"wrote {args.md} and {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
