"""CPU seconds per step of 4 gradcompd (world size 4) on loopback.

    PYTHONPATH=client/python /usr/bin/python3 bench/e2e/loopback_cpu.py \\
        [--codecs none,qsgd] [--steps 4] [--io shm|inline] [--base_port 21100] \\
        [--daemon_arg=--error_sample_rate=1 ...] [--local] [--bucket_mib 25]

Starts 4 daemons peered over 127.0.0.1 and 4 tests/e2e/worker.py clients,
each reducing the ResNet-50 gradient set over one ReduceStream per step
(the workload of bench/run_e2e_bench without the namespaces, so no root);
with --local the 4 daemons are unpeered (world size 1 each), for the same
machine load without the peer part, and with --bucket_mib the clients
reduce the gradients flattened into groups of that many MiB, for the same
bytes in fewer messages (docs/benchmarks.md, "Where a top-k step's context
switches go"). Prints, per codec, the median over the
timed steps (step 0 is warm-up) of the CPU seconds each daemon and each
client spent in the step and the daemon's context switches in it (every
thread's, voluntary and not), averaged over the 4 ranks, and the slowest
rank's wall time; and the daemons' peak resident memory and minor page
faults over the whole run. On a shared machine compare the CPU seconds,
not the wall time: the wall time moves with whatever else runs. $GRADCOMPD picks another daemon binary and --daemon_arg
adds flags to every daemon, for A/B runs of two builds or settings; the
daemons inherit the environment, so GLIBC_TUNABLES=glibc.malloc.hugetlb=0
runs them with their heap on 4 KiB pages (docs/daemon.md, Limits).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
import e2e_bench  # noqa: E402

W = 4


def daemon_memory(pid: int) -> dict[str, float]:
    """Peak resident MiB and minor page faults of a daemon so far (fresh
    pages cost a fault each, and their clearing, on first touch)."""
    status = pathlib.Path(f"/proc/{pid}/status").read_text()
    hwm_kb = next(int(line.split()[1]) for line in status.splitlines()
                  if line.startswith("VmHWM:"))
    stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    minflt = int(stat[stat.rindex(")") + 2:].split()[7])
    return {"peak_rss_mib": hwm_kb / 1024, "minor_faults": minflt}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--codecs", default="none,qsgd")
    p.add_argument("--steps", type=int, default=4, help="per codec, the first is warm-up")
    p.add_argument("--io", choices=("inline", "shm"), default="shm")
    p.add_argument("--base_port", type=int, default=21100,
                   help="peer ports from here, API +10, metrics +20; below the "
                   "kernel's ephemeral range (32768-60999), where an outgoing "
                   "connection may already hold a port")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--out", default=None, help="keep logs and results here")
    p.add_argument("--local", action="store_true",
                   help="4 unpeered daemons (world size 1 each): the same "
                   "machine load without the peer part")
    p.add_argument("--bucket_mib", type=float, default=0,
                   help="clients reduce the gradients in flattened groups of "
                   "this many MiB (tests/e2e/worker.py); 0: one tensor each")
    p.add_argument("--parts", choices=("on", "off"), default="on",
                   help="shared-memory tensors as requests with parts, or one "
                   "request each (tests/e2e/worker.py)")
    p.add_argument("--batch_mib", type=float, default=0,
                   help="clients declare batches of this many MiB of consecutive "
                   "tensors (tests/e2e/worker.py); 0: none")
    p.add_argument("--daemon_arg", action="append", default=[],
                   help="one more gradcompd flag (repeatable)")
    args = p.parse_args()

    binary = os.environ.get("GRADCOMPD") or str(REPO / "bazel-bin/service/gradcompd")
    work = pathlib.Path(args.out or tempfile.mkdtemp(prefix="gcloop"))
    work.mkdir(parents=True, exist_ok=True)
    barriers = work / "barriers"
    barriers.mkdir(exist_ok=True)
    peer = [args.base_port + i for i in range(W)]
    api = [args.base_port + 10 + i for i in range(W)]
    mon = [args.base_port + 20 + i for i in range(W)]
    peers = ",".join(f"127.0.0.1:{port}" for port in peer)
    env = dict(os.environ, PYTHONPATH=str(REPO / "client/python"),
               **e2e_bench.KEEP_FREED_MEMORY)
    load_before = e2e_bench.load_average()
    daemons, workers = [], []
    try:
        for i in range(W):
            membership = (["--world_size=1"] if args.local else
                          [f"--rank={i}", f"--world_size={W}", f"--peers={peers}"])
            daemons.append(subprocess.Popen(
                [binary, *membership, f"--listen=127.0.0.1:{api[i]}",
                 f"--metrics_listen=127.0.0.1:{mon[i]}",
                 "--collective_timeout=120s", "--peer_startup_timeout=60s",
                 "--allow_client_shm", *args.daemon_arg],
                stdout=open(work / f"gradcompd.{i}.log", "wb"), stderr=subprocess.STDOUT))
        for i in range(W):
            workers.append(subprocess.Popen(
                [sys.executable, str(REPO / "tests/e2e/worker.py"), f"--rank={i}",
                 f"--world_size={W}", f"--peers_up={0 if args.local else W - 1}",
                 f"--target=127.0.0.1:{api[i]}",
                 f"--metrics_url=http://127.0.0.1:{mon[i]}/metrics",
                 f"--barrier_dir={barriers}", f"--steps={args.steps}",
                 f"--codecs={args.codecs}", f"--io={args.io}", "--qdisc_dev=",
                 f"--daemon_pid={daemons[i].pid}", "--rpc_timeout=300",
                 "--barrier_timeout=300", f"--bucket_mib={args.bucket_mib}",
                 f"--batch_mib={args.batch_mib}", f"--parts={args.parts}",
                 f"--out={work / f'worker.{i}.json'}"],
                env=env, stdout=open(work / f"worker.{i}.log", "wb"),
                stderr=subprocess.STDOUT))
        e2e_bench.wait_all(workers, daemons, args.timeout, "loopback")
        memory = [daemon_memory(d.pid) for d in daemons]
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
        e2e_bench.stop(daemons)
    results = [json.loads((work / f"worker.{i}.json").read_text()) for i in range(W)]
    load_after = e2e_bench.load_average()
    print(f"daemon {binary} {' '.join(args.daemon_arg)}"
          f"{' (4 unpeered daemons: --local)' if args.local else ''}")
    print(f"io {args.io}; 1-minute load {load_before:.1f} before, {load_after:.1f} after; "
          f"logs in {work}")
    peak = statistics.mean(m["peak_rss_mib"] for m in memory)
    faults = statistics.mean(m["minor_faults"] for m in memory)
    print(f"daemons over the run (mean of the {W}): peak RSS {peak:.0f} MiB, "
          f"{faults:.0f} minor page faults")
    print("| codec | daemon CPU s / step | daemon context switches / step "
          "| client CPU s / step | step wall s |")
    print("| --- | ---: | ---: | ---: | ---: |")
    summary = {}
    for codec in args.codecs.split(","):
        steps = [[s for s in r["steps"] if s["codec"] == codec and s["step"] > 0]
                 for r in results]
        n = len(steps[0])
        daemon = statistics.median(
            statistics.mean(steps[r][k]["daemon_cpu_s"] for r in range(W)) for k in range(n))
        client = statistics.median(
            statistics.mean(steps[r][k]["client_cpu_s"] for r in range(W)) for k in range(n))
        switches = statistics.median(
            statistics.mean(steps[r][k]["daemon_switches"] for r in range(W))
            for k in range(n))
        wall = statistics.median(max(steps[r][k]["wall_s"] for r in range(W))
                                 for k in range(n))
        summary[codec] = {"daemon_cpu_s": daemon, "daemon_switches": switches,
                          "client_cpu_s": client, "wall_s": wall}
        print(f"| {codec} | {daemon:.3f} | {switches:.0f} | {client:.3f} | {wall:.2f} |")
    (work / "summary.json").write_text(json.dumps(
        {"io": args.io, "local": args.local, "daemon": binary,
         "daemon_args": args.daemon_arg,
         "load_before": load_before, "load_after": load_after,
         "daemon_peak_rss_mib": peak, "daemon_minor_faults": faults,
         "codecs": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
