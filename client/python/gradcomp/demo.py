"""Sends a synthetic ResNet-50 gradient through every codec of a gradcompd.

    PYTHONPATH=client/python /usr/bin/python3 -m gradcomp.demo \\
        --target 127.0.0.1:50051 --metrics_url http://127.0.0.1:9464/metrics

For each codec the daemon lists in GetInfo (overriding the policy per
request), and once more with no override ("policy": the daemon's own
policy), it reduces all 161 tensors (25.6M values, see gradcomp.resnet50)
over one ReduceStream and prints raw and wire bytes, compression ratio, the
relative error it measures itself from the results, the daemon's encode and
decode time and the wall time. After each codec it prints the daemon's
/metrics lines for it, and at the end checks that the daemon's counters
grew by exactly what the responses reported. Exits 1 if they disagree.
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import time

import numpy as np

from gradcomp import metrics, resnet50
from gradcomp.client import Client, ReduceStats

_COUNTERS = ("gradcomp_reduce_total", "gradcomp_raw_bytes_total",
             "gradcomp_wire_bytes_total")


class Totals:
    """What the responses say the daemon should have counted, by codec."""

    def __init__(self) -> None:
        self.reduces: collections.Counter[str] = collections.Counter()
        self.raw: collections.Counter[str] = collections.Counter()
        self.wire: collections.Counter[str] = collections.Counter()

    def add(self, stats: ReduceStats) -> None:
        self.reduces[stats.codec] += 1
        self.raw[stats.codec] += stats.raw_bytes
        self.wire[stats.codec] += stats.wire_bytes


def _print_metric_lines(samples: list[metrics.Sample], codec: str) -> None:
    for sample in samples:
        if sample.name in _COUNTERS and sample.labels.get("codec") == codec:
            print(f"    /metrics  {sample.line}")


def _check_metrics(before: list[metrics.Sample], after: list[metrics.Sample],
                   expected: Totals) -> bool:
    print("\nmetrics check: daemon counter growth / sum of the responses' stats")
    print(f"  {'codec':<12} {'reduces':>26} {'raw bytes':>26} {'wire bytes':>26}")
    ok = True
    for codec in sorted(expected.reduces):
        cells = []
        for name, want, labels in (
                ("gradcomp_reduce_total", expected.reduces[codec], {"code": "OK"}),
                ("gradcomp_raw_bytes_total", expected.raw[codec], {}),
                ("gradcomp_wire_bytes_total", expected.wire[codec], {})):
            got = (metrics.total(after, name, codec=codec, **labels) -
                   metrics.total(before, name, codec=codec, **labels))
            ok &= got == want
            cells.append(f"{int(got)}/{want}" + ("" if got == want else " (!)"))
        print(f"  {codec:<12} " + " ".join(f"{c:>26}" for c in cells))
    print("  metrics agree with the responses" if ok else
          "  MISMATCH: the daemon's counters do not match the responses")
    return ok


def run(target: str | None, metrics_url: str, seed: int,
        wait_s: float = 600.0) -> bool:
    client = Client(target, timeout=300.0)
    target = client.target
    # A trainer may start before its sidecar listens or before the other
    # ranks' daemons are up (the Helm chart starts them side by side): a
    # reduce sent then would wait for them until --collective_timeout and
    # fail, and the container would restart.
    client.wait_serving(timeout=wait_s)
    info = client.info()
    policy, policy_hash = client.get_policy()
    print(f"gradcompd {info.version} at {target}: world size {info.world_size}, "
          f"wire format v{info.wire_format_version}, device {info.device}, "
          f"policy {policy_hash[:12]}")
    print("codecs: " + ", ".join(c.name for c in info.codecs))

    started = time.perf_counter()
    grads = resnet50.synthetic_gradients(seed)
    numel = sum(g.size for g in grads.values())
    norm2 = sum(float(np.dot(g.ravel().astype(np.float64), g.ravel())) for g in grads.values())
    print(f"ResNet-50 gradient: {len(grads)} tensors, {numel:,} values, "
          f"{numel * 4 / 1e6:.1f} MB fp32 (generated in "
          f"{time.perf_counter() - started:.1f} s, seed {seed})")
    # Compress from the first step that the policy does not hold dense for
    # warm-up, so that the "policy" row shows the policy's codecs at work.
    step = policy.warmup_steps
    print(f"step {step} (policy warm-up: {policy.warmup_steps} steps)\n")

    before = metrics.scrape(metrics_url)
    expected = Totals()
    header = (f"{'codec':<10} {'raw MB':>9} {'wire MB':>9} {'ratio':>8} "
              f"{'rel error':>10} {'encode s':>9} {'decode s':>9} {'wall s':>7}")
    print(header)
    print("-" * len(header))
    rows = [(c.name, c.name) for c in info.codecs] + [("policy", None)]
    for label, codec in rows:
        t0 = time.perf_counter()
        # A job per row, so that stateful codecs (top-k residuals) start
        # fresh; released once the row is in, so that they start fresh again
        # in a later run against the same daemons (a sidecar that outlives
        # the demo), and its state is not held for good. Not before the row:
        # that would free a faster rank's messages for it.
        job = f"demo-{label}"
        results = client.reduce_many(grads, step=step, codec=codec, job=job)
        wall = time.perf_counter() - t0
        raw = wire = 0
        encode = decode = err2 = 0.0
        chosen: collections.Counter[str] = collections.Counter()
        for name, (out, stats) in results.items():
            expected.add(stats)
            chosen[stats.codec + (f" ({stats.dense_reason})" if stats.dense_reason else "")] += 1
            raw += stats.raw_bytes
            wire += stats.wire_bytes
            encode += stats.encode_seconds
            decode += stats.decode_seconds
            diff = grads[name].astype(np.float64) - out
            err2 += float(np.dot(diff.ravel(), diff.ravel()))
        del results
        client.release_job(job)
        ratio = raw / wire if wire else float("inf")
        print(f"{label:<10} {raw / 1e6:>9.1f} {wire / 1e6:>9.2f} {ratio:>7.1f}x "
              f"{np.sqrt(err2 / norm2):>10.2e} {encode:>9.3f} {decode:>9.3f} "
              f"{wall:>7.2f}", flush=True)
        if codec is None:
            print("    policy chose: " + ", ".join(
                f"{c} x{n}" for c, n in sorted(chosen.items())))
        else:
            _print_metric_lines(metrics.scrape(metrics_url), codec)
    return _check_metrics(before, metrics.scrape(metrics_url), expected)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gradcomp.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default=None,
                        help="gradcompd address, unix:/path or host:port (default: "
                             "$GRADCOMP_TARGET, else the daemon's default socket)")
    parser.add_argument("--metrics_url",
                        default=os.environ.get("GRADCOMP_METRICS_URL",
                                               "http://127.0.0.1:9464/metrics"),
                        help="the daemon's Prometheus endpoint (default: "
                             "$GRADCOMP_METRICS_URL, which the Helm chart's "
                             "example trainer sets, else the daemon's default)")
    parser.add_argument("--seed", type=int, default=0, help="gradient model seed")
    parser.add_argument("--wait_s", type=float, default=600.0,
                        help="how long to wait for the daemon to be SERVING (it "
                             "listens, and all its peers are connected)")
    args = parser.parse_args(argv)
    return 0 if run(args.target, args.metrics_url, args.seed, args.wait_s) else 1


if __name__ == "__main__":
    sys.exit(main())
