"""Shaped multi-host test: 4 gradcompd in 4 namespaces on 1 Gbit/s links.

    sudo /usr/bin/python3 tests/e2e/e2e_test.py [--steps 2] [--keep_logs DIR]

(tests/e2e/run is the entry point that tools/test calls.) Builds the network
of shaped_net.py, starts one gradcompd per host (peers on 10.77.0.<i+1>:50052,
client API and /metrics on the host's loopback), runs worker.py on every
host (the demo workload: the ResNet-50 gradient set, every tensor through
`none`, `topk` ratio 0.01 and `qsgd` 4-bit, --steps steps each), then checks
for every codec and step:

  payload   each tensor's stats.wire_bytes is the codec's payload size:
            32-byte header + 8-byte parameter block + body, with body
            4n (none), 4 ceil(n/512) + ceil(4n/8) (qsgd 4-bit, bucket 512),
            and for topk ceil(c/128) width bytes + c gaps of at most 32 bits
            + 4c value bytes, c near ceil(0.01 n);
  peers     gradcomp_peer_bytes_total{peer,direction="sent"} grew on every
            rank, to every peer, by exactly the bytes the collectives send:
            allgather (topk, qsgd) the rank's whole payload to each peer;
            reduce-scatter + allgather (none) the slice to each peer,
            twice, after a 40-byte header (the payload's parameter block)
            the first time and a 33-byte one the second; "received" equals
            what the other side sent;
  metrics   gradcomp_wire_bytes_total{codec} grew by the sum of the
            responses' wire_bytes;
  link      the bytes every host's shaped link carried (tbf's count: IP/TCP
            headers per segment, ACKs, HTTP/2 and gRPC framing, the
            MessageHeader frames, keepalives) are 1.00 .. 1.10 x the peer
            payload bytes; the overhead is printed.

Prints PASS/FAIL per check and exits 1 on any failure.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
import shaped_net  # noqa: E402

W = 4
PEER_PORT = 50052
# A reduce-scatter slice carries the payload's whole 8-byte parameter block
# (its owner checks that every rank's matches); the owner's summed slice
# the 1-byte element type alone.
SCATTER_HEADER = 32 + 8
GATHER_HEADER = 32 + 1
LINK_OVERHEAD_MAX = 1.10


def slice_size(m: int, w: int, j: int) -> int:
    # service/collective/peer_collective.cc: slice j is [m*j/w, m*(j+1)/w).
    return m * (j + 1) // w - m * j // w


def expected_payload(codec: str, n: int, wire: int) -> tuple[bool, str]:
    """Whether `wire` is the size of a `codec` payload of n values."""
    if codec == "none":
        want = 40 + 4 * n
        return wire == want, f"{want}"
    if codec == "qsgd":
        want = 40 + 4 * math.ceil(n / 512) + math.ceil(4 * n / 8)
        return wire == want, f"{want}"
    if codec == "topk":
        # c is what the sampled threshold selects: near k, not always k.
        k = max(1, math.ceil(0.01 * n - 1e-9))
        lo = 40 + 4 * max(1, k // 2)             # at least half of k values
        hi = 40 + 2 * k * (4 + 4) + math.ceil(2 * k / 128)  # at most 2k, 32-bit gaps
        return lo <= wire <= hi, f"[{lo}, {hi}] (k={k})"
    return False, "unknown codec"


def expected_sent(tensors: dict, numel: dict, rank: int, peer: int) -> int:
    total = 0
    for name, t in tensors.items():
        if t["codec"] == "none":
            m = numel[name]
            total += (SCATTER_HEADER + GATHER_HEADER
                      + 4 * (slice_size(m, W, peer) + slice_size(m, W, rank)))
        else:
            total += t["wire_bytes"]
    return total


class Checks:
    def __init__(self) -> None:
        self.failed = 0
        self.passed = 0

    def check(self, ok: bool, what: str) -> None:
        print(f"{'PASS' if ok else 'FAIL'}  {what}", flush=True)
        if ok:
            self.passed += 1
        else:
            self.failed += 1


def run_cluster(args: argparse.Namespace, work: pathlib.Path) -> list[dict]:
    binary = os.environ.get("GRADCOMPD") or str(REPO / "bazel-bin/service/gradcompd")
    if not os.access(binary, os.X_OK):
        raise FileNotFoundError(f"no gradcompd at {binary}: bazel build //service:gradcompd")
    with shaped_net.ShapedNetwork(args.prefix, W, args.rate) as net:
        peers = ",".join(f"{net.address(i)}:{PEER_PORT}" for i in range(W))
        daemons = []
        for i in range(W):
            log = open(work / f"gradcompd.{i}.log", "wb")
            daemons.append(net.popen(i, [
                binary, f"--rank={i}", f"--world_size={W}", f"--peers={peers}",
                "--listen=127.0.0.1:50051", "--metrics_listen=127.0.0.1:9464",
                "--collective_timeout=60s", "--peer_startup_timeout=60s"],
                stdout=log, stderr=subprocess.STDOUT))
        barriers = work / "barriers"
        barriers.mkdir()
        env = dict(os.environ, PYTHONPATH=str(REPO / "client/python"))
        workers = []
        for i in range(W):
            log = open(work / f"worker.{i}.log", "wb")
            workers.append(net.popen(i, [
                sys.executable, str(HERE / "worker.py"), f"--rank={i}",
                f"--world_size={W}", f"--barrier_dir={barriers}",
                f"--steps={args.steps}", f"--codecs={args.codecs}",
                f"--out={work / f'worker.{i}.json'}"],
                env=env, stdout=log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + args.timeout
        failed = None
        while any(w.poll() is None for w in workers):
            for i, w in enumerate(workers):
                if w.poll() not in (None, 0):
                    failed = f"worker {i} exited {w.returncode}"
            for i, d in enumerate(daemons):
                if d.poll() is not None:
                    failed = f"gradcompd {i} exited {d.returncode}"
            if failed or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if failed is None and any(w.poll() is None for w in workers):
            failed = f"workers still running after {args.timeout} s"
        if failed is None and any(w.returncode != 0 for w in workers):
            failed = "a worker failed"
        for d in daemons:
            if d.poll() is None:
                d.send_signal(signal.SIGTERM)
        for d in daemons:
            try:
                d.wait(timeout=10)
            except subprocess.TimeoutExpired:
                d.kill()
    if failed:
        for name in sorted(os.listdir(work)):
            if name.endswith(".log"):
                text = (work / name).read_text(errors="replace")
                print(f"--- {name} (last 1500 chars)\n{text[-1500:]}")
        raise RuntimeError(failed)
    return [json.loads((work / f"worker.{i}.json").read_text()) for i in range(W)]


def check_results(results: list[dict], checks: Checks, codecs: list[str],
                  steps_per_codec: int) -> None:
    want = [(codec, step) for codec in codecs for step in range(steps_per_codec)]
    bad = [f"rank {r}: {got}" for r, got in
           enumerate([[(st["codec"], st["step"]) for st in result["steps"]]
                      for result in results]) if got != want]
    checks.check(bool(want) and not bad,
                 f"every rank reduced {steps_per_codec} steps of each of {codecs}"
                 + (f"; {bad[:2]}" if bad else ""))
    if bad:
        return
    numel = results[0]["numel"]
    n_steps = len(want)
    rows = []
    for s in range(n_steps):
        steps = [r["steps"][s] for r in results]
        codec, step = steps[0]["codec"], steps[0]["step"]
        tag = f"{codec} step {step}"
        # payload sizes
        bad = []
        for r, st in enumerate(steps):
            for name, t in st["tensors"].items():
                ok, want = expected_payload(codec, numel[name], t["wire_bytes"])
                if t["codec"] != codec or not ok:
                    bad.append(f"rank {r} {name}: codec {t['codec']}, "
                               f"{t['wire_bytes']} bytes, expected {want}")
        checks.check(not bad, f"{tag}: every payload (161 tensors x {W} ranks) has the "
                     f"{codec} size" + (f"; {len(bad)} wrong, first: {bad[0]}" if bad else ""))
        # peer counters, exact
        bad = []
        for r, st in enumerate(steps):
            for p in range(W):
                if p == r:
                    continue
                want = expected_sent(st["tensors"], numel, r, p)
                got = st["counters"].get(f"sent.{p}", 0)
                if got != want:
                    bad.append(f"rank {r} -> {p}: sent {got}, expected {want}")
                recv = st["counters"].get(f"received.{p}", 0)
                theirs = steps[p]["counters"].get(f"sent.{r}", 0)
                if recv != theirs:
                    bad.append(f"rank {r} received {recv} from {p}, which sent {theirs}")
        checks.check(not bad, f"{tag}: gradcomp_peer_bytes_total sent/received match the "
                     f"collective's payload bytes exactly on all {W * (W - 1)} links"
                     + (f"; {bad[:3]}" if bad else ""))
        # wire_bytes_total
        bad = []
        for r, st in enumerate(steps):
            want = sum(t["wire_bytes"] for t in st["tensors"].values())
            got = st["counters"].get(f"wire.{codec}", 0)
            if got != want:
                bad.append(f"rank {r}: {got} != {want}")
        checks.check(not bad, f"{tag}: gradcomp_wire_bytes_total{{codec=\"{codec}\"}} "
                     f"grew by the responses' wire_bytes" + (f"; {bad}" if bad else ""))
        # link bytes vs payload bytes
        peer_sent = sum(v for st in steps for k, v in st["counters"].items()
                        if k.startswith("sent."))
        link = sum(st["qdisc_sent"] for st in steps)
        ratio = link / peer_sent if peer_sent else float("inf")
        checks.check(1.0 <= ratio <= LINK_OVERHEAD_MAX,
                     f"{tag}: link bytes / peer payload bytes = {ratio:.4f} "
                     f"(allowed 1.00 .. {LINK_OVERHEAD_MAX:.2f})")
        payload = sum(t["wire_bytes"] for st in steps for t in st["tensors"].values()) / W
        rows.append(f"{codec:<6} {step:>4} {payload / 1e6:>16.3f} {peer_sent / W / 1e6:>13.3f} "
                    f"{link / W / 1e6:>9.3f} {100 * (ratio - 1):>8.2f}% "
                    f"{max(st['wall_s'] for st in steps):>7.2f}")
    print(f"\n{'codec':<6} {'step':>4} {'payload MB/rank':>16} {'peer MB/rank':>13} "
          f"{'link MB/rank':>12} {'overhead':>9} {'wall s':>7}")
    print("\n".join(rows))


def main() -> int:
    shaped_net.cleanup_on_sigterm()
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prefix", default=f"gce{os.getpid() % 100000}")
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--codecs", default="none,topk,qsgd")
    p.add_argument("--timeout", type=float, default=150, help="seconds for the workers")
    p.add_argument("--keep_logs", help="copy logs and worker JSON here")
    args = p.parse_args()
    if os.geteuid() != 0:
        print("FAIL  tests/e2e needs root (ip netns)")
        return 1
    checks = Checks()
    work = pathlib.Path(tempfile.mkdtemp(prefix="gradcomp-e2e-"))
    try:
        try:
            results = run_cluster(args, work)
        except Exception as error:  # report, then fail
            checks.check(False, f"cluster run: {error}")
            return 1
        check_results(results, checks, args.codecs.split(","), args.steps)
    finally:
        if args.keep_logs:
            shutil.copytree(work, args.keep_logs, dirs_exist_ok=True)
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{checks.passed} passed, {checks.failed} failed")
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
