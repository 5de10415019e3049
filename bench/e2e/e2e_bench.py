"""End-to-end benchmark on 4 namespaces joined by 1 Gbit/s tbf links.

    sudo bench/run_e2e_bench [--steps 4] [--out DIR] [--client_malloc default]
        [--world_size 2]

Three phases on the network of tests/e2e/shaped_net.py, one run:
  local   4 gradcompd with --world_size=1 (no peers), the 4 workers at once:
          what a step costs without any network under the same CPU sharing
          (client API, encode, decode). This is the "codec time" term.
  shaped  4 gradcompd with --world_size=4 over the shaped links: none,
          topk (ratio 0.01), qsgd (4 bits), ResNet-50 gradient set.
  gloo    torch.distributed gloo, 4 processes, DDP-style 25 MiB buckets.
Clients run with KEEP_FREED_MEMORY (glibc settings) unless --client_malloc
default, and hand tensors to their daemon through shared memory unless --io
inline (gRPC inline bytes). Step 0 of each codec is warm-up; the median of the remaining steps is
reported, a step's time being the slowest rank's. Prints a Markdown table
and writes results.json to --out. --world_size sets the number of hosts
(4 by default): on this 2-core machine, 4 hosts get half a core each and
2 hosts a core each.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "tests/e2e"))
import shaped_net  # noqa: E402

PEER_PORT = 50052
GLOO_PORT = 29500
# glibc settings for the client processes (gradcomp's and Gloo's alike), as
# docs/clients.md recommends for trainers that send large tensors inline:
# keep freed memory for reuse instead of faulting in fresh pages each step.
# gradcompd sets the same itself (service/main.cc).
KEEP_FREED_MEMORY = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_THRESHOLD_": str(1 << 30),
                     "MALLOC_TRIM_THRESHOLD_": str((1 << 31) - 1)}


def client_env(args: argparse.Namespace, **extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO / "client/python"), **extra)
    if args.client_malloc == "keep":
        env.update(KEEP_FREED_MEMORY)
    return env


def load_average() -> float:
    return float(pathlib.Path("/proc/loadavg").read_text().split()[0])


def wait_all(procs: list[subprocess.Popen], daemons: list[subprocess.Popen],
             timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while any(p.poll() is None for p in procs):
        for i, p in enumerate(procs):
            if p.poll() not in (None, 0):
                raise RuntimeError(f"{what}: worker {i} exited {p.returncode}")
        for i, d in enumerate(daemons):
            if d.poll() is not None:
                raise RuntimeError(f"{what}: gradcompd {i} exited {d.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: still running after {timeout} s")
        time.sleep(0.2)
    bad = [i for i, p in enumerate(procs) if p.returncode != 0]
    if bad:
        raise RuntimeError(f"{what}: workers {bad} failed")


def stop(daemons: list[subprocess.Popen]) -> None:
    for d in daemons:
        if d.poll() is None:
            d.send_signal(signal.SIGTERM)
    for d in daemons:
        try:
            d.wait(timeout=10)
        except subprocess.TimeoutExpired:
            d.kill()


def gradcomp_phase(net: shaped_net.ShapedNetwork, work: pathlib.Path, name: str,
                   world: int, args: argparse.Namespace) -> list[dict]:
    binary = os.environ.get("GRADCOMPD") or str(REPO / "bazel-bin/service/gradcompd")
    W = args.world_size
    peers = ",".join(f"{net.address(i)}:{PEER_PORT}" for i in range(W))
    daemons, workers = [], []
    env = client_env(args)
    barriers = work / f"barriers-{name}"
    barriers.mkdir()
    try:
        for i in range(W):
            flags = ([f"--rank={i}", f"--world_size={W}", f"--peers={peers}",
                      "--collective_timeout=120s", "--peer_startup_timeout=60s"]
                     if world > 1 else ["--world_size=1"])
            daemons.append(net.popen(i, [binary, *flags, *args.daemon_arg,
                                         "--listen=127.0.0.1:50051",
                                         "--metrics_listen=127.0.0.1:9464",
                                         "--allow_client_shm"],
                                     stdout=open(work / f"{name}.gradcompd.{i}.log", "wb"),
                                     stderr=subprocess.STDOUT))
        for i in range(W):
            workers.append(net.popen(i, [
                sys.executable, str(REPO / "tests/e2e/worker.py"), f"--rank={i}",
                f"--world_size={W}", f"--peers_up={world - 1}",
                f"--barrier_dir={barriers}", f"--steps={args.steps}",
                f"--codecs={args.codecs}", "--rpc_timeout=300", "--barrier_timeout=300",
                f"--io={args.io}", f"--daemon_pid={daemons[i].pid}",
                f"--batch_mib={args.batch_mib}", f"--parts={args.parts}",
                f"--out={work / f'{name}.{i}.json'}"], env=env,
                stdout=open(work / f"{name}.worker.{i}.log", "wb"), stderr=subprocess.STDOUT))
        wait_all(workers, daemons, args.phase_timeout, name)
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
        stop(daemons)
    return [json.loads((work / f"{name}.{i}.json").read_text()) for i in range(W)]


def gloo_phase(net: shaped_net.ShapedNetwork, work: pathlib.Path,
               args: argparse.Namespace) -> list[dict]:
    W = args.world_size
    env = client_env(args, GLOO_SOCKET_IFNAME="eth0")
    procs = []
    try:
        for i in range(W):
            procs.append(net.popen(i, [
                sys.executable, str(HERE / "gloo_worker.py"), f"--rank={i}",
                f"--world_size={W}", f"--master={net.address(0)}:{GLOO_PORT}",
                f"--steps={args.steps}", f"--out={work / f'gloo.{i}.json'}"], env=env,
                stdout=open(work / f"gloo.{i}.log", "wb"), stderr=subprocess.STDOUT))
        wait_all(procs, [], args.phase_timeout, "gloo")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return [json.loads((work / f"gloo.{i}.json").read_text()) for i in range(W)]


def step_times(results: list[dict], codec: str | None = None) -> list[float]:
    """Per step, the slowest rank's wall time; warm-up step 0 dropped."""
    per_rank = [[s for s in r["steps"] if codec is None or s["codec"] == codec]
                for r in results]
    times = [max(rank[i]["wall_s"] for rank in per_rank) for i in range(len(per_rank[0]))]
    return times[1:]


def summarize(local: list[dict], shaped: list[dict], gloo: list[dict],
              args: argparse.Namespace) -> dict:
    rate = args.rate_bps
    gloo_t = step_times(gloo)
    gloo_med = statistics.median(gloo_t)
    dense_bytes = sum(local[0]["numel"].values()) * 4
    gloo_link = statistics.median(max(r["steps"][i]["qdisc_sent"] for r in gloo)
                                  for i in range(1, args.steps))
    W = args.world_size
    gloo_wire = 2 * (W - 1) / W * dense_bytes  # ring allreduce, per rank
    rows = [{"name": "gloo allreduce (dense fp32)", "median_s": gloo_med, "steps_s": gloo_t,
             "payload_bytes_sent": gloo_wire, "link_bytes_sent": gloo_link,
             "wire_limit_s": gloo_wire * 8 / rate, "local_s": 0.0}]
    for codec in args.codecs.split(","):
        t = step_times(shaped, codec)
        lt = step_times(local, codec)
        steps = [[s for s in r["steps"] if s["codec"] == codec][1:] for r in shaped]
        sent = statistics.median(
            max(sum(v for k, v in rank[i]["counters"].items() if k.startswith("sent."))
                for rank in steps) for i in range(len(steps[0])))
        link = statistics.median(max(rank[i]["qdisc_sent"] for rank in steps)
                                 for i in range(len(steps[0])))
        cpu = {what: statistics.median(
            statistics.mean(rank[i][what] for rank in steps) for i in range(len(steps[0])))
            for what in ("daemon_cpu_s", "client_cpu_s")}
        rows.append({"name": codec, "median_s": statistics.median(t), "steps_s": t, **cpu,
                     "payload_bytes_sent": sent, "link_bytes_sent": link,
                     "wire_limit_s": sent * 8 / rate,
                     "local_s": statistics.median(lt), "local_steps_s": lt})
    for row in rows:
        row["vs_gloo"] = gloo_med / row["median_s"]
        row["vs_wire"] = row["median_s"] / row["wire_limit_s"]
        row["vs_wire_plus_local"] = row["median_s"] / (row["wire_limit_s"] + row["local_s"])
    return {"rate_bps": rate, "dense_bytes": dense_bytes, "rows": rows}


def table(summary: dict) -> str:
    lines = ["| method | step s (median) | MB sent / rank | link MB / rank | wire limit s "
             "| local step s (W=1) | Gloo / this | this / wire limit "
             "| this / (wire limit + local) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in summary["rows"]:
        lines.append(
            f"| {r['name']} | {r['median_s']:.2f} | {r['payload_bytes_sent'] / 1e6:.2f} "
            f"| {r['link_bytes_sent'] / 1e6:.2f} | {r['wire_limit_s']:.3f} "
            f"| {r['local_s']:.2f} | {r['vs_gloo']:.2f}x | {r['vs_wire']:.1f}x "
            f"| {r['vs_wire_plus_local']:.2f}x |")
    lines += ["", "| codec | daemon CPU s / step / rank | client CPU s / step / rank |",
              "| --- | ---: | ---: |"]
    lines += [f"| {r['name']} | {r['daemon_cpu_s']:.2f} | {r['client_cpu_s']:.2f} |"
              for r in summary["rows"] if "daemon_cpu_s" in r]
    return "\n".join(lines)


def main() -> int:
    shaped_net.cleanup_on_sigterm()
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prefix", default=f"gcb{os.getpid() % 100000}")
    p.add_argument("--world_size", type=int, default=4,
                   help="hosts (namespaces), one daemon, worker and Gloo process "
                   "each; on 2 cores, 2 gives each host a core")
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--rate_bps", type=float, default=1e9)
    p.add_argument("--steps", type=int, default=8,
                   help="per codec, the first is warm-up; the median of the rest "
                   "is reported (the first few steps still grow the heap)")
    p.add_argument("--codecs", default="none,topk,qsgd",
                   help="methods, each a codec forced on every tensor, or "
                   "'policy': the daemons' policy decides (tests/e2e/worker.py)")
    p.add_argument("--daemon_arg", action="append", default=[],
                   help="an extra gradcompd flag for every daemon, e.g. "
                   "--daemon_arg=--config=FILE for a policy; repeatable")
    p.add_argument("--phase_timeout", type=float, default=900)
    p.add_argument("--out", default=None)
    p.add_argument("--client_malloc", choices=("keep", "default"), default="keep",
                   help="keep: clients run with KEEP_FREED_MEMORY; default: glibc's "
                        "defaults")
    p.add_argument("--parts", choices=("on", "off"), default="on",
                   help="shared-memory tensors as requests with parts, or one "
                   "request each (tests/e2e/worker.py)")
    p.add_argument("--batch_mib", type=float, default=25,
                   help="clients declare batches of this many MiB of consecutive "
                   "tensors, whose rounds travel as one collective "
                   "(tests/e2e/worker.py), as the DDP hook does by default; 0: "
                   "one collective per tensor")
    p.add_argument("--io", choices=("shm", "inline"), default="shm",
                   help="how workers hand tensors to their daemon (tests/e2e/worker.py)")
    args = p.parse_args()
    out = pathlib.Path(args.out or tempfile.mkdtemp(prefix="gradcomp-e2e-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    load = {"start": load_average()}
    with shaped_net.ShapedNetwork(args.prefix, args.world_size, args.rate) as net:
        local = gradcomp_phase(net, out, "local", 1, args)
        load["after_local"] = load_average()
        print(f"local done at {time.monotonic() - started:.0f} s", flush=True)
        shaped = gradcomp_phase(net, out, "shaped", args.world_size, args)
        load["after_shaped"] = load_average()
        print(f"shaped done at {time.monotonic() - started:.0f} s", flush=True)
        gloo = gloo_phase(net, out, args)
        load["after_gloo"] = load_average()
        print(f"gloo done at {time.monotonic() - started:.0f} s", flush=True)
    summary = summarize(local, shaped, gloo, args)
    summary["runtime_s"] = time.monotonic() - started
    summary["load_average"] = load
    summary["client_malloc"] = args.client_malloc
    summary["io"] = args.io
    summary["gloo_buckets"] = gloo[0]["buckets"]
    (out / "results.json").write_text(json.dumps(summary, indent=1))
    print(table(summary))
    print(f"\nruntime {summary['runtime_s']:.0f} s; 1-min load average "
          + ", ".join(f"{k} {v:.1f}" for k, v in load.items())
          + f"; client malloc {args.client_malloc}; io {args.io}; results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
